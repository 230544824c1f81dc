package bootstrap_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/pki"
)

// An operator that renewed from a new cluster CA (during a rotation) keeps
// the bundle it was given in its certificate Secret; after a restart it
// reuses that certificate although the CA ConfigMap still names only the
// old CA. CAs of another cluster in the Secret are not taken.
func TestRestartAfterCARotationUsesStoredBundle(t *testing.T) {
	cl := newCluster(t)
	ns := newNamespace(t)
	cl.seed(t, ns, true)
	opts := options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
	creds, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.NoError(t, env.Client.Delete(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-nonce"}}))

	reissue := func(ca *pki.CA) []byte {
		t.Helper()
		_, certPEM, err := ca.IssueClient(pki.ClientRequest{Identity: creds.Identity, PublicKey: creds.Leaf.PublicKey.(ed25519.PublicKey), Validity: time.Hour}, time.Now())
		require.NoError(t, err)
		return certPEM
	}
	newCA, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	renewed := reissue(newCA)
	bundle := pki.EncodeBundle(cl.ca.Cert, newCA.Cert)
	require.NoError(t, bootstrap.StoreCert(t.Context(), env.Client, ns, opts.CertSecret, renewed, creds.KeyPEM, bundle))

	again, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.False(t, again.Registered, "the stored certificate of the new CA is reused")
	require.Equal(t, renewed, again.CertPEM)
	certs, err := pki.ParseCertificatesPEM(again.CAPEM)
	require.NoError(t, err)
	require.Len(t, certs, 3, "ConfigMap CA plus the stored bundle (the old CA twice)")
	want := x509.NewCertPool()
	want.AddCert(cl.ca.Cert)
	want.AddCert(newCA.Cert)
	require.True(t, again.Roots.Equal(want))

	// Control: without the new CA beside it (here a CA of another cluster,
	// which is never taken) the certificate is unusable and, with no nonce,
	// registration cannot run.
	foreign, err := pki.GenerateCA("other", 24*time.Hour, time.Now())
	require.NoError(t, err)
	require.NoError(t, bootstrap.StoreCert(t.Context(), env.Client, ns, opts.CertSecret, renewed, creds.KeyPEM, pki.EncodeBundle(foreign.Cert, newCA.Cert)))
	_, err = bootstrap.Ensure(t.Context(), env.Client, opts)
	require.ErrorIs(t, err, bootstrap.ErrNonceMissing, "a bundle holding a CA of another cluster is refused whole")
	_, err = bootstrap.Ensure(t.Context(), env.Client, opts)
	require.ErrorIs(t, err, bootstrap.ErrNonceMissing)
}
