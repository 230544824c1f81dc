package bootstrap

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

const rawKey = "thisisatest32bytekey123456789012"

func opts(t *testing.T, store objstore.Store, keyMaterial string, leader *atomic.Bool) Options {
	t.Helper()
	k, err := secrets.ParseKey([]byte(keyMaterial))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	return Options{
		ClusterID: "c1", Objects: store, Secrets: &secrets.Store{Objects: store, Ring: ring}, Keys: layout.New(""),
		CAValidity: time.Hour, IsLeader: leader.Load, RetryInterval: 10 * time.Millisecond, Log: logr.Discard(),
	}
}

func TestLeaderCreatesFollowerLoads(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var follower, leader atomic.Bool
	leader.Store(true)

	_, err := Once(ctx, opts(t, store, rawKey, &follower))
	require.ErrorIs(t, err, ErrMissing)

	// A follower waiting in Ensure gets the material once the leader made it.
	got := make(chan *Cluster, 1)
	go func() {
		c, err := Ensure(ctx, opts(t, store, rawKey, &follower))
		require.NoError(t, err)
		got <- c
	}()
	time.Sleep(30 * time.Millisecond)
	lc, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	fc := <-got
	require.True(t, lc.CA.Cert.Equal(fc.CA.Cert))
	require.True(t, lc.NonceKey.Equal(fc.NonceKey))
	// The cluster CA names the trust domain; no workload CA is made here
	// (they are per tenant, internal/workloadca).
	require.Equal(t, "c1", lc.CA.TrustDomain())

	// A second leader run loads instead of regenerating.
	again, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	require.True(t, lc.CA.Cert.Equal(again.CA.Cert))

	// Nothing in storage holds a plaintext private key or the encryption key.
	objs, err := store.List(ctx, "")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"cluster/ca.crt", "cluster/secret/ca.key", "cluster/secret/nonce-signing.key"}, keysOf(objs))
	for _, o := range objs {
		obj, err := store.Get(ctx, o.Key)
		require.NoError(t, err)
		require.False(t, bytes.Contains(obj.Body, []byte("PRIVATE KEY")), o.Key)
		require.False(t, bytes.Contains(obj.Body, []byte(rawKey)), o.Key)
	}
}

func keysOf(objs []objstore.ObjectInfo) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Key)
	}
	return out
}

func TestRecoversCertificateForStoredKey(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var leader atomic.Bool
	leader.Store(true)
	first, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	// The leader crashed after writing the key but before the certificate.
	require.NoError(t, store.Delete(ctx, "cluster/ca.crt"))
	second, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	require.True(t, first.CA.Cert.PublicKey.(ed25519.PublicKey).Equal(second.CA.Cert.PublicKey))
}

func TestWrongEncryptionKeyIsAClearError(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var leader atomic.Bool
	leader.Store(true)
	_, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	_, err = Once(ctx, opts(t, store, "another-32-byte-key-abcdefghijkl", &leader))
	require.ErrorIs(t, err, secrets.ErrUnknownKey)
	require.NotErrorIs(t, err, ErrMissing)
	// And nothing was overwritten.
	_, err = Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
}

func TestSharedWorkloadCANotCreatedNorLoaded(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var leader atomic.Bool
	leader.Store(true)
	_, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	_, err = store.Get(ctx, "cluster/workload-ca.crt")
	require.ErrorIs(t, err, objstore.ErrNotFound, "a new cluster has no shared workload CA")
	// A cluster from before per-tenant CAs keeps its shared one untouched
	// (internal/workloadca trusts it during the transition).
	shared, err := pki.GenerateWorkloadCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	_, err = store.Put(ctx, "cluster/workload-ca.crt", shared.CertPEM, objstore.PutOptions{})
	require.NoError(t, err)
	_, err = Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	obj, err := store.Get(ctx, "cluster/workload-ca.crt")
	require.NoError(t, err)
	require.Equal(t, shared.CertPEM, obj.Body)
}

func TestSwappedCAsAreRefused(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var leader atomic.Bool
	leader.Store(true)
	_, err := Once(ctx, opts(t, store, rawKey, &leader))
	require.NoError(t, err)
	o := opts(t, store, rawKey, &leader)
	// Someone stores a workload CA as the cluster CA.
	w, err := pki.GenerateWorkloadCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	wKey, err := pki.MarshalPrivateKeyPEM(w.Key)
	require.NoError(t, err)
	require.NoError(t, o.Secrets.Put(ctx, "cluster/secret/ca.key", wKey, objstore.PutOptions{}))
	_, err = store.Put(ctx, "cluster/ca.crt", w.CertPEM, objstore.PutOptions{})
	require.NoError(t, err)
	_, err = Once(ctx, o)
	require.ErrorContains(t, err, `cluster CA in cluster/ca.crt names trust domain "", want "c1"`)
}
