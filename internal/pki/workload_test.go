package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var policy = WorkloadPolicy{TrustDomain: "c1", ServerHosts: []string{"127.0.0.1", "::1", "localhost", "nstance.example.com", "10.0.0.5"}}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func TestWorkloadPolicy(t *testing.T) {
	refused := map[string]error{
		"operator URI":           policy.CheckURI(mustURL(t, "spiffe://c1/tenant/acme/operator/op-1")),
		"agent URI":              policy.CheckURI(mustURL(t, "spiffe://c1/tenant/acme/agent/i-1")),
		"server URI":             policy.CheckURI(mustURL(t, "spiffe://c1/shard/s1/server/srv")),
		"trust domain itself":    policy.CheckURI(mustURL(t, "spiffe://c1")),
		"upper case":             policy.CheckURI(mustURL(t, "SPIFFE://C1/tenant/acme/operator/op-1")),
		"user info and port":     policy.CheckURI(mustURL(t, "spiffe://x@c1:443/tenant/acme/operator/op-1")),
		"opaque spiffe":          policy.CheckURI(mustURL(t, "spiffe:c1/tenant/acme/operator/op-1")),
		"server DNS name":        policy.CheckDNS("nstance.example.com"),
		"server DNS other case":  policy.CheckDNS("NStance.Example.COM."),
		"wildcard over server":   policy.CheckDNS("*.example.com"),
		"localhost":              policy.CheckDNS("localhost"),
		"server IP":              policy.CheckIP(net.ParseIP("10.0.0.5")),
		"server IP v4-in-v6":     policy.CheckIP(net.ParseIP("::ffff:10.0.0.5")),
		"loopback v6":            policy.CheckIP(net.ParseIP("::1")),
		"server IP as DNS name":  policy.CheckDNS("10.0.0.5"),
		"common name is server":  policy.Check("nstance.example.com", nil, nil, nil),
		"no trust domain known":  WorkloadPolicy{}.CheckURI(mustURL(t, "spiffe://anything/x")),
		"several reasons joined": policy.Check("", []string{"localhost"}, []net.IP{net.ParseIP("10.0.0.5")}, nil),
	}
	for name, err := range refused {
		require.Error(t, err, name)
	}
	require.ErrorContains(t, refused["operator URI"], "trust domain spiffe://c1")
	require.ErrorContains(t, refused["server DNS name"], "name of the nstance-server")
	require.ErrorContains(t, refused["server IP"], "address of the nstance-server")
	require.ErrorContains(t, refused["several reasons joined"], "localhost")
	require.ErrorContains(t, refused["several reasons joined"], "10.0.0.5")

	allowed := map[string]error{
		"other trust domain": policy.CheckURI(mustURL(t, "spiffe://workloads.example/ns/web")),
		"c1 subdomain":       policy.CheckURI(mustURL(t, "spiffe://c1.example/x")),
		"https URI":          policy.CheckURI(mustURL(t, "https://c1/x")),
		"urn":                policy.CheckURI(mustURL(t, "urn:example:web")),
		"service DNS":        policy.CheckDNS("web.example.com"),
		"deeper wildcard":    policy.CheckDNS("*.nstance.example.com"),
		"other IP":           policy.CheckIP(net.ParseIP("10.0.0.6")),
		"instance id CN":     policy.Check("worker-0a1b2c3d", []string{"worker-0a1b2c3d.svc"}, []net.IP{net.ParseIP("10.1.0.1")}, nil),
	}
	for name, err := range allowed {
		require.NoError(t, err, name)
	}
}

func newWorkloadCA(t *testing.T) *CA {
	t.Helper()
	ca, err := GenerateWorkloadCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	return ca
}

func TestIssueWorkload(t *testing.T) {
	wca := newWorkloadCA(t)
	require.Empty(t, wca.TrustDomain())
	require.Empty(t, wca.Cert.URIs)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)

	// No usages: the explicit default, never "any", never a CA.
	cert, _, err := wca.IssueWorkload(WorkloadRequest{CommonName: "web", Organization: "acme", DNSNames: []string{"web.example.com"}, PublicKey: pub, Validity: time.Hour}, policy, time.Now())
	require.NoError(t, err)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	require.Equal(t, x509.KeyUsageDigitalSignature, cert.KeyUsage)
	require.True(t, cert.BasicConstraintsValid)
	require.False(t, cert.IsCA)
	require.Equal(t, []string{"acme"}, cert.Subject.Organization)
	_, err = cert.Verify(x509.VerifyOptions{Roots: wca.Pool(), DNSName: "web.example.com", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.NoError(t, err)
	// The cluster CA does not vouch for it.
	_, err = cert.Verify(x509.VerifyOptions{Roots: newCA(t).Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.ErrorAs(t, err, new(x509.UnknownAuthorityError))

	// Client auth only stays client auth only.
	cert, _, err = wca.IssueWorkload(WorkloadRequest{CommonName: "c", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, PublicKey: pub, Validity: time.Hour}, policy, time.Now())
	require.NoError(t, err)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)

	// RSA keys may also encipher.
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	cert, _, err = wca.IssueWorkload(WorkloadRequest{CommonName: "r", PublicKey: &rk.PublicKey, Validity: time.Hour}, policy, time.Now())
	require.NoError(t, err)
	require.Equal(t, x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment, cert.KeyUsage)

	for name, tc := range map[string]struct {
		ca      *CA
		req     WorkloadRequest
		wantErr string
	}{
		"usage any":          {wca, WorkloadRequest{Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}, "is not server or client auth"},
		"code signing":       {wca, WorkloadRequest{Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}}, "is not server or client auth"},
		"operator URI":       {wca, WorkloadRequest{URIs: []*url.URL{mustURL(t, "spiffe://c1/tenant/acme/operator/op")}}, "trust domain"},
		"server DNS name":    {wca, WorkloadRequest{DNSNames: []string{"nstance.example.com"}}, "name of the nstance-server"},
		"server IP":          {wca, WorkloadRequest{IPs: []net.IP{net.ParseIP("127.0.0.1")}}, "address of the nstance-server"},
		"signed by cluster":  {newCA(t), WorkloadRequest{}, "refusing to sign a workload certificate with the cluster CA"},
		"no validity":        {wca, WorkloadRequest{Validity: -1}, "validity must be positive"},
		"cluster identities": {wca, WorkloadRequest{}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			req := tc.req
			req.CommonName, req.PublicKey = "x", pub
			if req.Validity == 0 {
				req.Validity = time.Hour
			}
			if tc.wantErr == "" {
				// The workload CA issues no control-plane identity.
				_, _, err := tc.ca.IssueClient(ClientRequest{Identity: Identity{ClusterID: "c1", Tenant: "t", Role: RoleOperator, ClientID: "op"}, PublicKey: pub, Validity: time.Hour}, time.Now())
				require.ErrorContains(t, err, "not a cluster CA")
				_, _, err = tc.ca.IssueServer(ServerIdentity{ClusterID: "c1", Shard: "s", ServerID: "x"}, nil, pub, time.Hour, time.Now())
				require.ErrorContains(t, err, "not a cluster CA")
				return
			}
			_, _, err := tc.ca.IssueWorkload(req, policy, time.Now())
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// serveTLS accepts TLS connections presenting cert and writes "ok" after the handshake.
func serveTLS(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerTLS(cert, nil, false))
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

// TestOnlyServerIdentitiesServe presents certificates that are not server
// certificates but carry the server's address to a client configured with
// ClientTLS: each handshake is refused.
func TestOnlyServerIdentitiesServe(t *testing.T) {
	ca := newCA(t)
	wca := newWorkloadCA(t)
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pair := func(c *x509.Certificate) tls.Certificate {
		return tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key, Leaf: c}
	}
	ip := []net.IP{net.ParseIP("127.0.0.1")}

	good, err := ca.ServerKeyPair(ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)
	// What a template could get before: cluster CA, server auth, the server's IP.
	oldTemplate, _, err := ca.sign(&x509.Certificate{
		Subject: pkix.Name{CommonName: "i-1", Organization: []string{"acme"}}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: ip,
	}, key.Public())
	require.NoError(t, err)
	// ...and with an operator URI on top.
	withOperatorURI, _, err := ca.sign(&x509.Certificate{
		Subject: pkix.Name{CommonName: "op", Organization: []string{"acme"}}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: ip,
		URIs: []*url.URL{mustURL(t, "spiffe://c1/tenant/acme/operator/op")},
	}, key.Public())
	require.NoError(t, err)
	// An agent identity certificate (client auth only) with the server's IP.
	agent, _, err := ca.IssueClient(ClientRequest{Identity: Identity{ClusterID: "c1", Tenant: "acme", Role: RoleAgent, ClientID: "i-1"}, PublicKey: key.Public(), IPs: ip, Validity: time.Hour}, now)
	require.NoError(t, err)
	// A workload certificate (server auth): signed by the untrusted workload CA.
	workload, _, err := wca.IssueWorkload(WorkloadRequest{CommonName: "i-1", DNSNames: []string{"web.example.com"}, PublicKey: key.Public(), Validity: time.Hour}, policy, now)
	require.NoError(t, err)
	// A server certificate of another cluster, whose CA the client does not trust.
	other, err := GenerateCA("c2", time.Hour, now)
	require.NoError(t, err)
	foreign, err := other.ServerKeyPair(ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)

	dial := func(addr, name string) error {
		conn, err := tls.Dial("tcp", addr, ClientTLS(ca.Pool(), nil, name))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	require.NoError(t, dial(serveTLS(t, good), "127.0.0.1"))
	for name, tc := range map[string]struct {
		cert    tls.Certificate
		server  string
		wantErr string
	}{
		"template cert with server IP":    {pair(oldTemplate), "127.0.0.1", "no spiffe URI SAN"},
		"template cert with operator URI": {pair(withOperatorURI), "127.0.0.1", "not a server identity"},
		"agent identity cert":             {pair(agent), "127.0.0.1", "incompatible key usage"},
		"workload cert":                   {pair(workload), "web.example.com", "unknown authority"},
		"server of another cluster":       {foreign, "127.0.0.1", "unknown authority"},
	} {
		t.Run(name, func(t *testing.T) {
			err := dial(serveTLS(t, tc.cert), tc.server)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestTenantWorkloadCA(t *testing.T) {
	now := time.Now()
	newCA := func(tenant string) *CA {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		ca, err := SelfSignTenantWorkloadCA("c1", tenant, priv, time.Hour, now)
		require.NoError(t, err)
		return ca
	}
	a, b := newCA("acme"), newCA("globex")
	require.Equal(t, TenantWorkloadCACommonName("c1", "globex"), b.Cert.Subject.CommonName)
	require.Empty(t, b.TrustDomain(), "no trust domain: never a control-plane CA")
	require.True(t, b.Cert.IsCA)

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	req := WorkloadRequest{CommonName: "i-1", DNSNames: []string{"svc.globex.test"}, PublicKey: pub, Validity: time.Hour}
	fromA, _, err := a.IssueWorkload(req, WorkloadPolicy{TrustDomain: "c1"}, now)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(b.Cert)
	_, err = fromA.Verify(x509.VerifyOptions{Roots: roots, DNSName: "svc.globex.test"})
	require.Error(t, err, "tenant A's certificate is not trusted by tenant B's CA")

	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, err = SelfSignTenantWorkloadCA("c1", "", priv, time.Hour, now)
	require.ErrorContains(t, err, "tenant is required")
}
