package pki

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
)

func TestParseCertificatesPEM(t *testing.T) {
	a, err := GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	b, err := GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	certs, err := ParseCertificatesPEM(EncodeBundle(a.Cert, b.Cert, a.Cert))
	require.NoError(t, err)
	require.Len(t, certs, 2, "duplicates are dropped")
	require.Equal(t, Fingerprint(a.Cert), Fingerprint(certs[0]))

	for name, in := range map[string][]byte{
		"empty":    nil,
		"key":      []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
		"trailing": append(EncodeBundle(a.Cert), []byte("garbage")...),
	} {
		_, err := ParseCertificatesPEM(in)
		require.Error(t, err, name)
	}
}

func TestTrustRefusesForeignBundles(t *testing.T) {
	now := time.Now()
	a, _ := GenerateCA("c1", time.Hour, now)
	b, _ := GenerateCA("c1", time.Hour, now)
	other, _ := GenerateCA("c2", time.Hour, now)
	wl, err := SelfSignWorkloadCA("c1", mustKey(t), time.Hour, now)
	require.NoError(t, err)

	tr, err := NewTrust(a, nil)
	require.NoError(t, err)
	require.Equal(t, []string{Fingerprint(a.Cert)}, tr.Fingerprints())

	changed, err := tr.Update(a, EncodeBundle(a.Cert, b.Cert))
	require.NoError(t, err)
	require.False(t, changed)
	require.Equal(t, []string{Fingerprint(a.Cert), Fingerprint(b.Cert)}, tr.Fingerprints())

	for name, bundle := range map[string][]byte{"other cluster": EncodeBundle(other.Cert), "workload CA": EncodeBundle(wl.Cert), "not PEM": []byte("x")} {
		_, err := tr.Update(b, bundle)
		require.Error(t, err, name)
		require.Equal(t, a, tr.Signer(), "a refused update changes nothing")
	}
	changed, err = tr.Update(b, EncodeBundle(b.Cert))
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, []string{Fingerprint(b.Cert)}, tr.Fingerprints())
	// The signer is trusted even when the bundle misses it.
	_, err = tr.Update(a, EncodeBundle(b.Cert))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{Fingerprint(a.Cert), Fingerprint(b.Cert)}, tr.Fingerprints())
}

// A server whose client CA pool and certificate follow a Trust, and a client
// whose roots follow its own bundle, keep handshaking through every phase of
// a rotation when each side applies what the phase gives it; a client that
// never learns the new CA is refused once the server switches, and a client
// certificate of the old CA is refused once it is retired.
func TestRotationHandshakes(t *testing.T) {
	now := time.Now()
	oldCA, _ := GenerateCA("c1", time.Hour, now)
	newCA, _ := GenerateCA("c1", time.Hour, now)
	trust, err := NewTrust(oldCA, nil)
	require.NoError(t, err)
	sid := ServerIdentity{Shard: "s1", ServerID: "a"}
	srvCert, err := NewRenewingCert(func(now time.Time) (tls.Certificate, error) {
		return trust.Signer().ServerKeyPair(sid, []string{"127.0.0.1"}, time.Hour, now)
	}, 2.0/3, nil, logr.Discard())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srvCert.Run(ctx)

	cfg := ServerTLS(tls.Certificate{}, nil, true)
	cfg.Certificates, cfg.GetCertificate = nil, srvCert.GetCertificate
	DynamicClientCAs(cfg, trust.Pool)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				if tc.Handshake() == nil {
					_, _ = tc.Write([]byte{1})
				}
			}()
		}
	}()

	type client struct {
		roots atomic.Pointer[x509.CertPool]
		cert  atomic.Pointer[tls.Certificate]
	}
	newClient := func(ca *CA) *client {
		c := &client{}
		c.roots.Store(ca.Pool())
		pair := clientPair(t, ca)
		c.cert.Store(&pair)
		return c
	}
	dial := func(c *client) error {
		tcfg := ClientTLSDynamic(c.roots.Load, nil, "127.0.0.1", nil)
		tcfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert.Load(), nil }
		conn, err := tls.Dial("tcp", ln.Addr().String(), tcfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		// TLS 1.3: the server's verdict on the client certificate arrives
		// with the first read.
		b := make([]byte, 1)
		if _, err := conn.Read(b); err != nil {
			return err
		}
		return nil
	}
	follower, laggard := newClient(oldCA), newClient(oldCA)
	require.NoError(t, dial(follower))
	require.NoError(t, dial(laggard))

	// introduce
	_, err = trust.Update(oldCA, EncodeBundle(oldCA.Cert, newCA.Cert))
	require.NoError(t, err)
	follower.roots.Store(trust.Pool())
	require.NoError(t, dial(follower))
	require.NoError(t, dial(laggard))

	// switch: the server re-issues its certificate from the new CA at once.
	changed, err := trust.Update(newCA, EncodeBundle(oldCA.Cert, newCA.Cert))
	require.NoError(t, err)
	require.True(t, changed)
	srvCert.RenewNow()
	require.Eventually(t, func() bool {
		return srvCert.Current().Leaf.CheckSignatureFrom(newCA.Cert) == nil
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, dial(follower), "old client certificate, bundle roots")
	err = dial(laggard)
	var uerr x509.UnknownAuthorityError
	require.ErrorAs(t, err, &uerr, "a client that never took the bundle cannot verify the new server certificate")
	pair := clientPair(t, newCA)
	follower.cert.Store(&pair)
	require.NoError(t, dial(follower))

	// retire
	_, err = trust.Update(newCA, EncodeBundle(newCA.Cert))
	require.NoError(t, err)
	follower.roots.Store(trust.Pool())
	require.NoError(t, dial(follower))
	stale := newClient(oldCA)
	stale.roots.Store(trust.Pool())
	require.Error(t, dial(stale), "a client certificate of the retired CA is refused")
}

func clientPair(t *testing.T, ca *CA) tls.Certificate {
	t.Helper()
	key := mustKey(t)
	cert, _, err := ca.IssueClient(ClientRequest{Identity: Identity{ClusterID: "c1", Tenant: "t", Role: RoleOperator, ClientID: "op"},
		PublicKey: key.Public(), Validity: time.Hour}, time.Now())
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

func TestClientTLSDynamicChecksNameAndIdentity(t *testing.T) {
	ca, _ := GenerateCA("c1", time.Hour, time.Now())
	good, err := ca.ServerKeyPair(ServerIdentity{Shard: "s1", ServerID: "a"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	notServer := clientPair(t, ca)
	for name, tc := range map[string]struct {
		cert       tls.Certificate
		serverName string
		ok         bool
	}{
		"server identity": {good, "127.0.0.1", true},
		"wrong name":      {good, "example.com", false},
		"client identity": {notServer, "127.0.0.1", false},
		"no name given":   {good, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ClientTLSDynamic(ca.Pool, nil, tc.serverName, nil)
			err := cfg.VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.cert.Leaf}})
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
	require.Error(t, ClientTLSDynamic(ca.Pool, nil, "x", nil).VerifyConnection(tls.ConnectionState{}), "no certificate")
}

func mustKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return k
}
