package importedca_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/importedca"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func kubeadmCA(t *testing.T, now time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

func newStore(t *testing.T) (*importedca.Store, *memstore.Store) {
	t.Helper()
	k, err := secrets.ParseKey([]byte(strings.Repeat("ab", 32)))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	mem := memstore.New()
	return &importedca.Store{Objects: mem, Keys: layout.Keys{}, Secrets: &secrets.Store{Objects: mem, Ring: ring}}, mem
}

func TestImportLoadListDelete(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	s, mem := newStore(t)
	certPEM, keyPEM := kubeadmCA(t, now)

	ca, err := s.Import(ctx, "kubernetes", certPEM, keyPEM, nil, false, now)
	require.NoError(t, err)
	// The key is never stored in plaintext.
	raw, err := mem.Get(ctx, layout.Keys{}.ImportedCAKey("kubernetes"))
	require.NoError(t, err)
	require.NotContains(t, string(raw.Body), "PRIVATE KEY")

	got, err := s.Load(ctx, "kubernetes")
	require.NoError(t, err)
	require.True(t, pki.SameKey(ca, got))

	_, err = s.Import(ctx, "kubernetes", certPEM, keyPEM, nil, false, now)
	require.ErrorContains(t, err, "already imported")
	_, err = s.Import(ctx, "kubernetes", certPEM, keyPEM, nil, true, now)
	require.NoError(t, err)

	infos, err := s.List(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	require.Equal(t, "kubernetes", infos[0].Name)
	require.Equal(t, "CN=kubernetes", infos[0].Subject)

	require.NoError(t, s.Delete(ctx, "kubernetes"))
	_, err = s.Load(ctx, "kubernetes")
	require.ErrorIs(t, err, importedca.ErrNotImported)
}

func TestImportRefuses(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	s, _ := newStore(t)
	certPEM, keyPEM := kubeadmCA(t, now)
	_, otherKey := kubeadmCA(t, now)
	cluster, err := pki.GenerateCA("c1", time.Hour, now)
	require.NoError(t, err)
	clusterKey, err := pki.MarshalPrivateKeyPEM(cluster.Key)
	require.NoError(t, err)
	workload, err := pki.GenerateWorkloadCA("c1", time.Hour, now)
	require.NoError(t, err)
	workloadKey, err := pki.MarshalPrivateKeyPEM(workload.Key)
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		name      string
		cert, key []byte
		now       time.Time
		want      string
	}{
		"reserved name":   {"workload", certPEM, keyPEM, now, "reserved"},
		"bad name":        {"../x", certPEM, keyPEM, now, "invalid CA name"},
		"key of another":  {"k", certPEM, otherKey, now, "does not match"},
		"not a key":       {"k", certPEM, []byte("nope"), now, "CA key"},
		"expired":         {"k", certPEM, keyPEM, now.Add(48 * time.Hour), "expired"},
		"the cluster CA":  {"k", cluster.CertPEM, clusterKey, now, "trust domain"},
		"the workload CA": {"k", workload.CertPEM, workloadKey, now, "own CAs"},
	} {
		_, err := s.Import(ctx, tc.name, tc.cert, tc.key, []*pki.CA{cluster, workload}, false, tc.now)
		require.ErrorContains(t, err, tc.want, name)
	}
	infos, err := s.List(ctx)
	require.NoError(t, err)
	require.Empty(t, infos, "a refused import stores nothing")
}

func TestCacheSeesImportWithinTTL(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	s, _ := newStore(t)
	clock := now
	c := &importedca.Cache{Store: s, TTL: 10 * time.Second, Now: func() time.Time { return clock }}
	_, err := c.Get(ctx, "kubernetes")
	require.ErrorIs(t, err, importedca.ErrNotImported)

	certPEM, keyPEM := kubeadmCA(t, now)
	_, err = s.Import(ctx, "kubernetes", certPEM, keyPEM, nil, false, now)
	require.NoError(t, err)
	_, err = c.Get(ctx, "kubernetes")
	require.ErrorIs(t, err, importedca.ErrNotImported, "the absence is cached for the TTL")
	clock = clock.Add(11 * time.Second)
	ca, err := c.Get(ctx, "kubernetes")
	require.NoError(t, err)
	require.NotNil(t, ca)
}
