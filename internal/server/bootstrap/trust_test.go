package bootstrap

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// WatchTrust follows the bundle and the signer in storage, calls back when
// the signer changes, and keeps what it has while the key and certificate
// do not match (a rotation step between its two writes) or the bundle is bad.
func TestWatchTrustFollowsStorage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := memstore.New()
	var leader atomic.Bool
	leader.Store(true)
	o := opts(t, store, rawKey, &leader)
	cl, err := Once(ctx, o)
	require.NoError(t, err)
	require.Nil(t, cl.CABundlePEM)
	trust, err := pki.NewTrust(cl.CA, cl.CABundlePEM)
	require.NoError(t, err)
	var switched atomic.Int32
	done := make(chan struct{})
	go func() { defer close(done); WatchTrust(ctx, o, trust, 10*time.Millisecond, func() { switched.Add(1) }) }()

	next, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	put := func(key string, body []byte) {
		t.Helper()
		_, err := store.Put(ctx, key, body, objstore.PutOptions{})
		require.NoError(t, err)
	}
	oldFP, newFP := pki.Fingerprint(cl.CA.Cert), pki.Fingerprint(next.Cert)

	put(o.Keys.CABundle(), pki.EncodeBundle(cl.CA.Cert, next.Cert))
	require.Eventually(t, func() bool { return len(trust.Fingerprints()) == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Zero(t, switched.Load())

	// Half a switch: the key is the new one, the certificate the old one.
	keyPEM, err := pki.MarshalPrivateKeyPEM(next.Key)
	require.NoError(t, err)
	require.NoError(t, o.Secrets.Put(ctx, o.Keys.CAKey(), keyPEM, objstore.PutOptions{}))
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, []string{oldFP, newFP}, trust.Fingerprints(), "a mismatched pair changes nothing")
	require.Zero(t, switched.Load())

	put(o.Keys.CACert(), next.CertPEM)
	require.Eventually(t, func() bool { return switched.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, newFP, pki.Fingerprint(trust.Signer().Cert))

	// A bundle with a foreign CA is refused: the trust stays.
	foreign, err := pki.GenerateCA("c2", time.Hour, time.Now())
	require.NoError(t, err)
	put(o.Keys.CABundle(), pki.EncodeBundle(next.Cert, foreign.Cert))
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, []string{newFP, oldFP}, trust.Fingerprints())

	put(o.Keys.CABundle(), pki.EncodeBundle(next.Cert))
	require.Eventually(t, func() bool { return len(trust.Fingerprints()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int32(1), switched.Load())
	cancel()
	<-done
}
