package clustercmd_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/carotation"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/workloadca"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// startRotating is startCluster with the server re-reading the CA every
// 100ms, so a rotation step reaches it quickly.
func startRotating(t *testing.T) *cluster {
	t.Helper()
	return startClusterWith(t, func(o *app.Options) { o.Log, o.TrustRefresh = testr.New(t), 100*time.Millisecond })
}

// client is an agent- or operator-like client: the CAs it trusts and the
// certificate it presents, both replaced as it renews.
type client struct {
	name  string
	roots atomic.Pointer[x509.CertPool]
	cert  atomic.Pointer[tls.Certificate]
}

func (c *client) setRoots(t *testing.T, bundlePEM []byte) {
	t.Helper()
	certs, err := pki.ParseCertificatesPEM(bundlePEM)
	require.NoError(t, err)
	p := x509.NewCertPool()
	for _, ca := range certs {
		p.AddCert(ca)
	}
	c.roots.Store(p)
}

func (c *client) tlsConfig() *tls.Config {
	cfg := pki.ClientTLSDynamic(c.roots.Load, nil, "127.0.0.1", nil)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert.Load(), nil }
	return cfg
}

// handshake dials addr and reads the server's first bytes (HTTP/2
// settings): with TLS 1.3 a refused client certificate shows there. It
// returns the certificate the server presented.
func (c *client) handshake(addr string) (*x509.Certificate, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	cfg := c.tlsConfig()
	cfg.NextProtos = []string{"h2"} // gRPC servers close connections without it
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0], nil
}

// The whole CA rotation against a running server, driven by the admin
// commands: an agent-like and an operator-like client handshake with the
// Agent and Operator listeners without pause, and not one handshake fails
// across introduce -> switch -> retire. Controls show the test can fail: a
// client that never takes the bundle is refused after the switch, and a
// client certificate of the old CA is refused after the retire.
func TestRotateCANoFailedHandshake(t *testing.T) {
	a := startRotating(t)
	ctx := context.Background()
	store := a.store
	keys := layout.New("")
	admin := func(args ...string) string {
		t.Helper()
		out, err := runAdmin(t, append([]string{"cluster", "rotate-ca", args[0], "--cluster-id", "example-cluster", "--bucket", "dev"}, args[1:]...)...)
		require.NoError(t, err, out)
		return out
	}
	status := func() carotation.Status {
		t.Helper()
		var st carotation.Status
		require.NoError(t, json.Unmarshal([]byte(admin("status", "-o", "json")), &st))
		return st
	}
	ring := func() *secrets.Store {
		k, err := secrets.ParseKey([]byte(encKey))
		require.NoError(t, err)
		r, err := secrets.NewKeyring(k)
		require.NoError(t, err)
		return &secrets.Store{Objects: store, Ring: r}
	}()
	// signerNow is the CA servers sign with, read as they read it.
	signerNow := func() *pki.CA {
		keyPEM, err := ring.Get(ctx, keys.CAKey())
		require.NoError(t, err)
		obj, err := store.Get(ctx, keys.CACert())
		require.NoError(t, err)
		ca, err := pki.LoadCA(obj.Body, keyPEM)
		require.NoError(t, err)
		return ca
	}
	bundleNow := func() []byte {
		obj, err := store.Get(ctx, keys.CABundle())
		require.NoError(t, err)
		return obj.Body
	}

	// The operator registers with the admin command and renews over the
	// Operator service, which returns the server's trusted bundle.
	opDir := t.TempDir()
	out, err := runAdmin(t, "cluster", "register-operator", "--cluster-id", "example-cluster", "--bucket", "dev",
		"--registration-addr", a.Addrs().Registration, "--operator-id", "op", "--out-dir", opDir)
	require.NoError(t, err, out)
	op := &client{name: "operator"}
	caPEM, err := os.ReadFile(filepath.Join(opDir, "ca.crt"))
	require.NoError(t, err)
	op.setRoots(t, caPEM)
	pair, err := tls.LoadX509KeyPair(filepath.Join(opDir, "operator.crt"), filepath.Join(opDir, "operator.key"))
	require.NoError(t, err)
	op.cert.Store(&pair)
	opPub, err := pki.MarshalPublicKeyPEM(pair.PrivateKey.(ed25519.PrivateKey).Public())
	require.NoError(t, err)
	opConn, err := grpc.NewClient(a.Addrs().Operator, grpc.WithTransportCredentials(credentials.NewTLS(op.tlsConfig())))
	require.NoError(t, err)
	defer opConn.Close()
	renewOperator := func() {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := nstancev1.NewOperatorServiceClient(opConn).RenewCertificate(rctx, &nstancev1.RenewCertificateRequest{PublicKeyPem: string(opPub)})
		require.NoError(t, err)
		leaf, err := pki.ParseCertificatePEM([]byte(resp.GetCertificatePem()))
		require.NoError(t, err)
		op.setRoots(t, []byte(resp.GetCaChainPem()))
		op.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: pair.PrivateKey, Leaf: leaf})
	}

	// The agent's certificate is issued by the signing CA as registration
	// or renewal would, and it takes the bundle it is handed with it.
	agentKey := func() ed25519.PrivateKey { _, k, _ := ed25519.GenerateKey(rand.Reader); return k }()
	renewAgent := func(c *client) {
		t.Helper()
		ca := signerNow()
		leaf, _, err := ca.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: "example-cluster", Tenant: "default", Role: pki.RoleAgent,
			ClientID: "agent-1", Shard: "dev-1", Group: "g"}, PublicKey: agentKey.Public(), Validity: time.Hour}, time.Now())
		require.NoError(t, err)
		c.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: agentKey, Leaf: leaf})
		if b, err := store.Get(ctx, keys.CABundle()); err == nil {
			c.setRoots(t, b.Body)
		} else {
			c.setRoots(t, ca.CertPEM)
		}
	}
	agent, laggard := &client{name: "agent"}, &client{name: "laggard"}
	renewAgent(agent)
	renewAgent(laggard)
	oldAgentCert := agent.cert.Load()

	// Handshakes without pause for the whole rotation.
	var attempts, failures atomic.Int64
	var failMu sync.Mutex
	var firstFailures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, target := range []struct {
		c    *client
		addr string
	}{{agent, a.Addrs().Agent}, {op, a.Addrs().Operator}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				attempts.Add(1)
				if _, err := target.c.handshake(target.addr); err != nil {
					failures.Add(1)
					failMu.Lock()
					if len(firstFailures) < 5 {
						firstFailures = append(firstFailures, fmt.Sprintf("%s: %v", target.c.name, err))
					}
					failMu.Unlock()
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	waitHandshakes := func(n int64) {
		t.Helper()
		base := attempts.Load()
		require.Eventually(t, func() bool { return attempts.Load() >= base+n }, 20*time.Second, 5*time.Millisecond)
	}
	presentedBy := func(ca *x509.Certificate) func() bool {
		return func() bool {
			leaf, err := op.handshake(a.Addrs().Operator)
			if err != nil {
				t.Logf("handshake: %v", err)
				return false
			}
			if err := leaf.CheckSignatureFrom(ca); err != nil {
				t.Logf("presented %s: %v", leaf.Issuer, err)
				return false
			}
			return true
		}
	}
	waitHandshakes(20)
	oldCA := signerNow().Cert
	require.Equal(t, carotation.PhaseNone, status().State.Phase)

	// introduce: the server trusts both and hands out the bundle.
	admin("introduce")
	st := status()
	require.Equal(t, carotation.PhaseIntroduced, st.State.Phase)
	require.Len(t, st.Bundle, 2)
	// Until the servers re-read it, renewal hands out the old chain: wait
	// for the bundle to come back from a renewal, as a real operator would.
	require.Eventually(t, func() bool {
		renewOperator()
		certs, err := pki.ParseCertificatesPEM(bundleNow())
		return err == nil && len(certs) == 2 && op.roots.Load().Equal(func() *x509.CertPool {
			p := x509.NewCertPool()
			for _, c := range certs {
				p.AddCert(c)
			}
			return p
		}())
	}, 10*time.Second, 50*time.Millisecond)
	renewAgent(agent)
	waitHandshakes(20)

	// switch: refused before its gate, then forced; the server re-issues
	// its certificate from the new CA at once.
	_, err = runAdmin(t, "cluster", "rotate-ca", "switch", "--cluster-id", "example-cluster", "--bucket", "dev")
	require.ErrorIs(t, err, carotation.ErrGate)
	t.Logf("before switch: %d handshakes, %d failed %v", attempts.Load(), failures.Load(), firstFailures)
	admin("switch", "--force")
	newCA := signerNow().Cert
	require.False(t, newCA.Equal(oldCA))
	require.Eventually(t, presentedBy(newCA), 10*time.Second, 20*time.Millisecond, "the server presents a certificate of the new CA")
	_, err = laggard.handshake(a.Addrs().Agent)
	require.Error(t, err, "control: a client that never took the bundle cannot verify the server any more")
	waitHandshakes(20)
	// Clients renew: certificates of the new CA.
	require.Eventually(t, func() bool {
		renewOperator()
		return op.cert.Load().Leaf.CheckSignatureFrom(newCA) == nil
	}, 10*time.Second, 50*time.Millisecond)
	renewAgent(agent)
	require.NoError(t, agent.cert.Load().Leaf.CheckSignatureFrom(newCA))
	waitHandshakes(20)

	// retire: refused before its gate, then forced; the bundle holds the
	// new CA alone and clients drop the old one at their next renewal.
	_, err = runAdmin(t, "cluster", "rotate-ca", "retire", "--cluster-id", "example-cluster", "--bucket", "dev")
	require.ErrorIs(t, err, carotation.ErrGate)
	admin("retire", "--force")
	st = status()
	require.Equal(t, carotation.PhaseRetired, st.State.Phase)
	require.Len(t, st.Bundle, 1)
	require.Equal(t, pki.Fingerprint(newCA), st.Bundle[0].Fingerprint)
	stale := &client{name: "stale"}
	stale.setRoots(t, bundleNow())
	stale.cert.Store(oldAgentCert)
	require.Eventually(t, func() bool {
		_, err := stale.handshake(a.Addrs().Agent)
		return err != nil
	}, 10*time.Second, 20*time.Millisecond, "control: a client certificate of the retired CA is refused once the server re-read the bundle")
	require.Eventually(t, func() bool {
		renewOperator()
		_, err := pki.ParseCertificatesPEM(bundleNow())
		require.NoError(t, err)
		return op.roots.Load().Equal(x509Pool(newCA))
	}, 10*time.Second, 50*time.Millisecond)
	renewAgent(agent)
	waitHandshakes(20)

	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	t.Logf("handshakes: %d, failed: %d", attempts.Load(), failures.Load())
	require.Zero(t, failures.Load(), "failed handshakes: %v", firstFailures)
	require.Greater(t, attempts.Load(), int64(100))
}

func x509Pool(cas ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range cas {
		p.AddCert(c)
	}
	return p
}

// rotate-encryption-key against dev-s3: every envelope the cluster leader
// wrote is re-sealed under the new key, the new key alone then opens them
// (a server and the admin commands given only it work), a run that was cut
// short is finished by the next, and a rerun changes nothing.
func TestRotateEncryptionKey(t *testing.T) {
	a := startCluster(t)
	ctx := context.Background()
	keys := layout.New("")
	const newKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	t.Setenv("NSTANCE_NEW_KEY", newKey)
	oldK, err := secrets.ParseKey([]byte(encKey))
	require.NoError(t, err)
	newK, err := secrets.ParseKey([]byte(newKey))
	require.NoError(t, err)
	both, err := secrets.NewKeyring(newK, oldK)
	require.NoError(t, err)
	newOnly, err := secrets.NewKeyring(newK)
	require.NoError(t, err)
	oldOnly, err := secrets.NewKeyring(oldK)
	require.NoError(t, err)
	// A tenant's workload CA, as a shard leader creates it on first use: its
	// key is one more envelope the rotation re-seals.
	wca := &workloadca.Store{Objects: a.store, Secrets: &secrets.Store{Objects: a.store, Ring: oldOnly}, Keys: keys,
		ClusterID: "example-cluster", Validity: 24 * time.Hour, Log: logr.Discard()}
	_, err = wca.CA(ctx, "default")
	require.NoError(t, err)
	envelopes, err := a.store.List(ctx, keys.SecretPrefix())
	require.NoError(t, err)
	require.Len(t, envelopes, 3, "CA key, tenant default's workload CA key, nonce-signing key")
	before := map[string][]byte{}
	for _, e := range envelopes {
		pt, err := (&secrets.Store{Objects: a.store, Ring: both}).Get(ctx, e.Key)
		require.NoError(t, err)
		before[e.Key] = pt
	}

	// Without the old key the envelopes cannot be opened: refused, nothing written.
	_, err = runAdmin(t, "cluster", "rotate-encryption-key", "--cluster-id", "example-cluster", "--bucket", "dev", "--key-env", "NSTANCE_NEW_KEY")
	require.ErrorIs(t, err, secrets.ErrUnknownKey)

	// A run cut short after the first envelope.
	_, err = (&secrets.Store{Objects: a.store, Ring: both}).Reseal(ctx, envelopes[0].Key)
	require.NoError(t, err)

	args := []string{"cluster", "rotate-encryption-key", "--cluster-id", "example-cluster", "--bucket", "dev",
		"--key-env", "NSTANCE_NEW_KEY", "--previous-key-env", "NSTANCE_ENCRYPTION_KEY", "-o", "json"}
	out, err := runAdmin(t, args...)
	require.NoError(t, err, out)
	var rep struct {
		KeyID string `json:"key_id"`
		secrets.ResealReport
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, newK.ID, rep.KeyID)
	require.Equal(t, 3, rep.Total)
	require.Equal(t, 2, rep.Resealed)
	require.Equal(t, 1, rep.AlreadyCurrent)

	for k, pt := range before {
		got, err := (&secrets.Store{Objects: a.store, Ring: newOnly}).Get(ctx, k)
		require.NoError(t, err, "the new key alone opens %s", k)
		require.Equal(t, pt, got)
	}
	out, err = runAdmin(t, args[:len(args)-2]...)
	require.NoError(t, err, out)
	require.Contains(t, out, "re-sealed: 0")
	require.Contains(t, out, "already current: 3")

	// The admin commands work with the new key alone.
	_, err = runAdmin(t, "cluster", "nonce", "--cluster-id", "example-cluster", "--bucket", "dev", "--key-env", "NSTANCE_NEW_KEY")
	require.NoError(t, err)
	out, err = runAdmin(t, "cluster", "rotate-ca", "introduce", "--cluster-id", "example-cluster", "--bucket", "dev", "--key-env", "NSTANCE_NEW_KEY")
	require.NoError(t, err, out)
	require.Contains(t, out, "phase: introduced")
}
