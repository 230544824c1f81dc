package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	return ca
}

func TestCARoundTrip(t *testing.T) {
	ca := newCA(t)
	keyPEM, err := MarshalPrivateKeyPEM(ca.Key)
	require.NoError(t, err)
	loaded, err := LoadCA(ca.CertPEM, keyPEM)
	require.NoError(t, err)
	require.True(t, loaded.Cert.Equal(ca.Cert))

	other := newCA(t)
	otherKey, err := MarshalPrivateKeyPEM(other.Key)
	require.NoError(t, err)
	_, err = LoadCA(ca.CertPEM, otherKey)
	require.ErrorContains(t, err, "does not match")
	_, err = LoadCA([]byte("junk"), keyPEM)
	require.ErrorContains(t, err, "CA certificate")
}

func TestIssueClientIdentity(t *testing.T) {
	ca := newCA(t)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tests := []struct {
		name    string
		id      Identity
		wantErr string
	}{
		{"agent", Identity{ClusterID: "c1", Tenant: "default", Role: RoleAgent, ClientID: "i-1", Shard: "s1", Group: "g"}, ""},
		{"operator", Identity{ClusterID: "c1", Tenant: "acme", Role: RoleOperator, ClientID: "op"}, ""},
		{"admin", Identity{ClusterID: "c1", Tenant: "acme", Role: RoleAdmin, ClientID: "adm"}, ""},
		{"bad role", Identity{ClusterID: "c1", Tenant: "acme", Role: "root", ClientID: "op"}, "invalid role"},
		{"server is no client role", Identity{ClusterID: "c1", Tenant: "acme", Role: "server", ClientID: "op"}, "invalid role"},
		{"other cluster", Identity{ClusterID: "c2", Tenant: "acme", Role: RoleOperator, ClientID: "op"}, "cannot be issued by the CA of cluster"},
		{"slash in tenant", Identity{ClusterID: "c1", Tenant: "a/b", Role: RoleAgent, ClientID: "op"}, "not allowed"},
		{"empty id", Identity{ClusterID: "c1", Tenant: "a", Role: RoleAgent}, "client id is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cert, pemBytes, err := ca.IssueClient(ClientRequest{Identity: tc.id, PublicKey: pub, Validity: time.Hour, IPs: []net.IP{net.ParseIP("10.0.0.1")}}, time.Now())
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			parsed, err := ParseCertificatePEM(pemBytes)
			require.NoError(t, err)
			require.True(t, parsed.Equal(cert))
			_, err = cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			require.NoError(t, err)
			got, err := IdentityFromCert(cert, "c1")
			require.NoError(t, err)
			require.Equal(t, tc.id, got)
			require.Equal(t, "spiffe://c1/tenant/"+tc.id.Tenant+"/"+string(tc.id.Role)+"/"+tc.id.ClientID, cert.URIs[0].String())
			_, err = IdentityFromCert(cert, "other")
			require.ErrorContains(t, err, "belongs to cluster")
		})
	}
}

func TestIdentityFromCertRejectsMismatch(t *testing.T) {
	ca := newCA(t)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	// A server certificate carries a server identity, not a client one.
	cert, _, err := ca.IssueServer(ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, pub, time.Hour, time.Now())
	require.NoError(t, err)
	_, err = IdentityFromCert(cert, "")
	require.ErrorContains(t, err, "is not spiffe://<cluster>/tenant/<tenant>/<role>/<id>")
	sid, err := ServerIdentityFromCert(cert, "c1")
	require.NoError(t, err)
	require.Equal(t, ServerIdentity{ClusterID: "c1", Shard: "s1", ServerID: "srv"}, sid)
	require.Equal(t, "spiffe://c1/shard/s1/server/srv", cert.URIs[0].String())
	// And a client certificate is no server certificate.
	client, _, err := ca.IssueClient(ClientRequest{Identity: Identity{ClusterID: "c1", Tenant: "t", Role: RoleAgent, ClientID: "i"}, PublicKey: pub, Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	_, err = ServerIdentityFromCert(client, "c1")
	require.ErrorContains(t, err, "not a server identity")
	// A CA only issues identities of its own cluster.
	_, _, err = ca.IssueServer(ServerIdentity{ClusterID: "c2", Shard: "s1", ServerID: "srv"}, nil, pub, time.Hour, time.Now())
	require.ErrorContains(t, err, "cannot be issued by the CA of cluster")
}

func TestParseEd25519PublicKeyPEM(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	p, err := MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	got, err := ParseEd25519PublicKeyPEM(p)
	require.NoError(t, err)
	require.True(t, pub.Equal(got))
	for _, bad := range [][]byte{nil, []byte("x"), newCA(t).CertPEM} {
		_, err := ParseEd25519PublicKeyPEM(bad)
		require.Error(t, err)
	}
}

func TestMutualTLSHandshake(t *testing.T) {
	ca := newCA(t)
	srvCert, err := ca.ServerKeyPair(ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerTLS(srvCert, ca.Pool(), true))
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
				if err := c.(*tls.Conn).Handshake(); err == nil {
					_, _ = c.Write([]byte("ok"))
				}
			}()
		}
	}()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	cert, _, err := ca.IssueClient(ClientRequest{Identity: Identity{ClusterID: "c1", Tenant: "t", Role: RoleOperator, ClientID: "op"}, PublicKey: pub, Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	client := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv}

	dial := func(c *tls.Certificate) error {
		conn, err := tls.Dial("tcp", ln.Addr().String(), ClientTLS(ca.Pool(), c, "127.0.0.1"))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = io.ReadAll(conn)
		if err != nil {
			return err
		}
		require.Equal(t, uint16(tls.VersionTLS13), conn.ConnectionState().Version)
		return nil
	}
	require.NoError(t, dial(&client))
	require.Error(t, dial(nil), "server must require a client certificate")
}

// TestClientChecksTheServersShard: a client of shard s1 refuses a valid
// server certificate of shard s2 of the same cluster, over a real handshake.
func TestClientChecksTheServersShard(t *testing.T) {
	ca := newCA(t)
	serve := func(shard string) string {
		srvCert, err := ca.ServerKeyPair(ServerIdentity{Shard: shard, ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, time.Now())
		require.NoError(t, err)
		ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerTLS(srvCert, nil, false))
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
					if err := c.(*tls.Conn).Handshake(); err == nil {
						_, _ = c.Write([]byte("ok"))
					}
				}()
			}
		}()
		return ln.Addr().String()
	}
	s1, s2 := serve("s1"), serve("s2")
	dial := func(addr, shard string) error {
		conn, err := tls.Dial("tcp", addr, ClientTLSForShard(ca.Pool(), nil, "127.0.0.1", shard))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	require.NoError(t, dial(s1, "s1"))
	require.NoError(t, dial(s2, "s2"))
	err := dial(s2, "s1")
	require.ErrorContains(t, err, `spiffe://c1/shard/s2/server/srv serves shard "s2", not "s1"`)
	require.ErrorContains(t, dial(s1, ""), `not ""`, "an empty shard matches no server")
}
