package registration

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/pki"
)

// With a Trust, the issuer signs with its current signer and hands out the
// whole bundle as the CA chain, following a rotation without a restart.
func TestIssuerFollowsTrust(t *testing.T) {
	oldCA, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	newCA, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	trust, err := pki.NewTrust(oldCA, pki.EncodeBundle(oldCA.Cert, newCA.Cert))
	require.NoError(t, err)
	i := &Issuer{Trust: trust, ClusterID: "c1", AgentValidity: time.Hour, OperatorValidity: time.Hour}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	id := pki.Identity{ClusterID: "c1", Tenant: "t", Role: pki.RoleOperator, ClientID: "op"}

	issue := func() (*Issued, int) {
		t.Helper()
		got, err := i.Issue(id, pub, nil, nil)
		require.NoError(t, err)
		chain, err := pki.ParseCertificatesPEM([]byte(got.CAChainPEM))
		require.NoError(t, err)
		return got, len(chain)
	}
	got, n := issue()
	require.Equal(t, 2, n)
	leaf, err := pki.ParseCertificatePEM([]byte(got.CertificatePEM))
	require.NoError(t, err)
	require.NoError(t, leaf.CheckSignatureFrom(oldCA.Cert))

	_, err = trust.Update(newCA, pki.EncodeBundle(newCA.Cert))
	require.NoError(t, err)
	got, n = issue()
	require.Equal(t, 1, n)
	leaf, err = pki.ParseCertificatePEM([]byte(got.CertificatePEM))
	require.NoError(t, err)
	require.NoError(t, leaf.CheckSignatureFrom(newCA.Cert))

	_, err = (&Issuer{ClusterID: "c1", AgentValidity: time.Hour, OperatorValidity: time.Hour}).Issue(id, pub, nil, nil)
	require.ErrorContains(t, err, "no CA")
}
