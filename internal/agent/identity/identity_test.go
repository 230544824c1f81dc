package identity_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"os"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
)

// serve runs a TLS server with a server identity of shard on loopback.
func serve(t *testing.T, ca *pki.CA, shard string) string {
	t.Helper()
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: shard, ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", pki.ServerTLS(cert, ca.Pool(), false))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(addr string, tc *tls.Config) error {
	c, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		return err
	}
	return c.Close()
}

// TestClientsCheckTheServersShard: before registration the shard comes from
// the nonce, afterwards from the agent's certificate; a server of another
// shard of the same cluster is refused by both TLS configurations.
func TestClientsCheckTheServersShard(t *testing.T) {
	ca, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	own, other := serve(t, ca, "s1"), serve(t, ca, "s2")
	d, err := identity.Open(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(d.Path(identity.CAFile), ca.CertPEM, 0o600))
	_, nonceKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tok, err := nonce.Mint(nonceKey, nonce.Claims{Kind: nonce.KindAgent, ClusterID: "c1", Tenant: "acme", Shard: "s1",
		RegisteredClaims: jwt.RegisteredClaims{Subject: "i-1"}}, time.Minute, time.Now())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(d.Path(identity.NonceFile), []byte(tok), 0o600))

	reg, err := d.RegistrationTLS("127.0.0.1")
	require.NoError(t, err)
	require.NoError(t, dial(own, reg))
	require.ErrorContains(t, dial(other, reg), `serves shard "s2", not "s1"`)

	key, err := d.Key()
	require.NoError(t, err)
	_, certPEM, err := ca.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: "c1", Tenant: "acme", Role: pki.RoleAgent,
		ClientID: "i-1", Shard: "s1", Group: "g"}, PublicKey: key.Public(), Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	require.NoError(t, d.SaveCertificate(string(certPEM), ""))
	require.NoError(t, d.RemoveNonce())
	for name, get := range map[string]func(string) (*tls.Config, error){"registration": d.RegistrationTLS, "agent": d.AgentTLS} {
		tc, err := get("127.0.0.1")
		require.NoError(t, err, name)
		require.NoError(t, dial(own, tc), name)
		require.ErrorContains(t, dial(other, tc), `serves shard "s2", not "s1"`, name)
	}

	require.NoError(t, os.WriteFile(d.Path(identity.NonceFile), []byte("not-a-jwt"), 0o600))
	_, err = d.RegistrationTLS("127.0.0.1")
	require.ErrorContains(t, err, "the nonce is not a JWT")
}
