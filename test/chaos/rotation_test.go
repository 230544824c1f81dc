package chaos

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/carotation"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// rotClient is an agent- or operator-like client of the real servers: the
// CAs it trusts and the certificate it presents, replaced as it renews.
type rotClient struct {
	name  string
	roots atomic.Pointer[x509.CertPool]
	cert  atomic.Pointer[tls.Certificate]
}

func (c *rotClient) setRoots(t *testing.T, bundlePEM []byte) {
	t.Helper()
	certs, err := pki.ParseCertificatesPEM(bundlePEM)
	require.NoError(t, err)
	p := x509.NewCertPool()
	for _, ca := range certs {
		p.AddCert(ca)
	}
	c.roots.Store(p)
}

func (c *rotClient) tlsConfig(host string) *tls.Config {
	cfg := pki.ClientTLSDynamic(c.roots.Load, nil, host, nil)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert.Load(), nil }
	return cfg
}

// errNotServing: nothing listens (a standby's gRPC ports are closed).
var errNotServing = errors.New("not serving")

// handshake connects to addr and completes TLS; with readReply it also
// reads the server's first bytes (HTTP/2 settings), where a refused client
// certificate shows with TLS 1.3. It returns the server's certificate.
func (c *rotClient) handshake(host, addr string, readReply bool) (*x509.Certificate, error) {
	raw, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		var se syscall.Errno
		if errors.As(err, &se) && se == syscall.ECONNREFUSED {
			return nil, errNotServing
		}
		return nil, err
	}
	cfg := c.tlsConfig(host)
	cfg.NextProtos = []string{"h2"}
	conn := tls.Client(raw, cfg)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := conn.Handshake(); err != nil {
		return nil, err
	}
	if readReply {
		if _, err := conn.Read(make([]byte, 1)); err != nil {
			return nil, err
		}
	}
	return conn.ConnectionState().PeerCertificates[0], nil
}

func (s *stack) admin(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return proctest.Output(context.Background(), s.env(s.s3URL), filepath.Join(s.bin, "nstance-admin"), append(args, "--cluster-id", clusterID, "--bucket", "dev")...)
}

// TestRotateCAWithoutFailedHandshakes rotates the cluster CA of two real
// servers (leader and standby) with the nstance-admin binary while an
// operator-like client (registered, renewing over RenewCertificate) and an
// agent-like client handshake without pause with every listener: the
// Operator and Agent ports (mutual TLS) and the election port of both
// servers. Not one handshake fails across introduce -> switch -> retire.
// Controls: a client that never takes the bundle is refused by the servers'
// new certificates, and an agent certificate of the old CA is refused after
// the retire.
func TestRotateCAWithoutFailedHandshakes(t *testing.T) {
	st := newStack(t, 2)
	ctx := context.Background()
	keys := layout.New("")
	store, err := s3store.NewWithClient(devs3test.Client(st.s3URL), devs3test.Bucket, "")
	require.NoError(t, err)
	k, err := secrets.ParseKey([]byte(encryptionKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	sec := &secrets.Store{Objects: store, Ring: ring}
	var caPEM []byte
	require.Eventually(t, func() bool {
		obj, err := store.Get(ctx, keys.CACert())
		if err == nil {
			caPEM = obj.Body
		}
		return err == nil
	}, 60*time.Second, 50*time.Millisecond, "cluster CA written")
	signerNow := func() *pki.CA {
		keyPEM, err := sec.Get(ctx, keys.CAKey())
		require.NoError(t, err)
		obj, err := store.Get(ctx, keys.CACert())
		require.NoError(t, err)
		ca, err := pki.LoadCA(obj.Body, keyPEM)
		require.NoError(t, err)
		return ca
	}
	oldCA := signerNow()

	// The operator registers with a nonce from nstance-admin.
	op := &rotClient{name: "operator"}
	op.setRoots(t, caPEM)
	nonce, err := st.admin(t, "cluster", "nonce", "--expiry", "1h")
	require.NoError(t, err)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	var certPEM []byte
	require.Eventually(t, func() bool {
		for _, srv := range st.servers {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := bootstrap.GRPCRegistrar{Timeout: 2 * time.Second, Hostname: "chaos"}.Register(rctx, srv.Registration(), op.roots.Load(),
				string(bytes.TrimSpace(nonce)), pubPEM)
			cancel()
			if err == nil {
				certPEM = c
				return true
			}
		}
		return false
	}, 60*time.Second, 100*time.Millisecond, "an operator registers with the leader")
	leaf, err := pki.ParseCertificatePEM(certPEM)
	require.NoError(t, err)
	op.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf})
	conns := map[*server]nstancev1.OperatorServiceClient{}
	for _, srv := range st.servers {
		conn, err := grpc.NewClient(srv.Operator(), grpc.WithTransportCredentials(credentials.NewTLS(op.tlsConfig(srv.host))))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		conns[srv] = nstancev1.NewOperatorServiceClient(conn)
	}
	// renewOperator renews with whichever server leads and takes the
	// returned chain as its bundle; it returns how many CAs that holds.
	renewOperator := func() int {
		for _, c := range conns {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := c.RenewCertificate(rctx, &nstancev1.RenewCertificateRequest{PublicKeyPem: string(pubPEM)})
			cancel()
			if err != nil {
				continue
			}
			leaf, err := pki.ParseCertificatePEM([]byte(resp.GetCertificatePem()))
			require.NoError(t, err)
			op.setRoots(t, []byte(resp.GetCaChainPem()))
			op.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf})
			certs, err := pki.ParseCertificatesPEM([]byte(resp.GetCaChainPem()))
			require.NoError(t, err)
			return len(certs)
		}
		return 0
	}
	require.Eventually(t, func() bool { return renewOperator() == 1 }, 30*time.Second, 100*time.Millisecond)

	// The agent-like client gets certificates of the signing CA and the
	// bundle, as registration and renewal hand them out.
	_, agentKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	renewAgent := func(c *rotClient) {
		ca := signerNow()
		leaf, _, err := ca.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: clusterID, Tenant: "default", Role: pki.RoleAgent,
			ClientID: "agent-1", Shard: shard, Group: "g"}, PublicKey: agentKey.Public(), Validity: time.Hour}, time.Now())
		require.NoError(t, err)
		c.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: agentKey, Leaf: leaf})
		if obj, err := store.Get(ctx, keys.CABundle()); err == nil {
			c.setRoots(t, obj.Body)
		} else {
			c.setRoots(t, ca.CertPEM)
		}
	}
	agent, laggard := &rotClient{name: "agent"}, &rotClient{name: "laggard"}
	renewAgent(agent)
	renewAgent(laggard)
	oldAgentCert := agent.cert.Load()

	var attempts, served, failures atomic.Int64
	var failMu sync.Mutex
	var firstFailures []string
	stopLoad := make(chan struct{})
	var wg sync.WaitGroup
	for _, srv := range st.servers {
		for _, target := range []struct {
			c         *rotClient
			addr      string
			readReply bool
		}{{op, srv.Operator(), true}, {agent, srv.addr(8994), true}, {op, srv.addr(8991), false}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stopLoad:
						return
					case <-time.After(20 * time.Millisecond):
					}
					attempts.Add(1)
					_, err := target.c.handshake(srv.host, target.addr, target.readReply)
					switch {
					case err == nil:
						served.Add(1)
					case errors.Is(err, errNotServing):
					default:
						failures.Add(1)
						failMu.Lock()
						if len(firstFailures) < 5 {
							firstFailures = append(firstFailures, fmt.Sprintf("%s -> %s: %v", target.c.name, target.addr, err))
						}
						failMu.Unlock()
					}
				}
			}()
		}
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(stopLoad)
			wg.Wait()
		}
	}
	defer stop()
	// everyServerPresents waits until both servers' election ports present
	// a certificate of ca (servers re-read the CA every 10 s).
	everyServerPresents := func(ca *x509.Certificate) {
		t.Helper()
		require.Eventually(t, func() bool {
			for _, srv := range st.servers {
				leaf, err := op.handshake(srv.host, srv.addr(8991), false)
				if err != nil || leaf.CheckSignatureFrom(ca) != nil {
					return false
				}
			}
			return true
		}, 40*time.Second, 100*time.Millisecond)
	}
	status := func() carotation.Status {
		t.Helper()
		out, err := st.admin(t, "cluster", "rotate-ca", "status", "-o", "json")
		require.NoError(t, err)
		var s carotation.Status
		require.NoError(t, json.Unmarshal(out, &s))
		return s
	}
	time.Sleep(time.Second)

	// introduce
	_, err = st.admin(t, "cluster", "rotate-ca", "introduce")
	require.NoError(t, err)
	require.Equal(t, carotation.PhaseIntroduced, status().State.Phase)
	require.Eventually(t, func() bool { return renewOperator() == 2 }, 40*time.Second, 200*time.Millisecond, "renewal hands out the bundle")
	renewAgent(agent)
	time.Sleep(time.Second)

	// switch
	_, err = st.admin(t, "cluster", "rotate-ca", "switch")
	require.ErrorContains(t, err, "not yet safe")
	_, err = st.admin(t, "cluster", "rotate-ca", "switch", "--force")
	require.NoError(t, err)
	newCA := signerNow()
	require.False(t, newCA.Cert.Equal(oldCA.Cert))
	everyServerPresents(newCA.Cert)
	_, err = laggard.handshake(st.servers[0].host, st.servers[0].addr(8991), false)
	var uerr x509.UnknownAuthorityError
	require.ErrorAs(t, err, &uerr, "control: a client without the bundle cannot verify the switched server")
	require.Eventually(t, func() bool {
		renewOperator()
		return op.cert.Load().Leaf.CheckSignatureFrom(newCA.Cert) == nil
	}, 30*time.Second, 200*time.Millisecond, "renewal issues from the new CA")
	renewAgent(agent)
	time.Sleep(time.Second)

	// retire
	_, err = st.admin(t, "cluster", "rotate-ca", "retire", "--force")
	require.NoError(t, err)
	s := status()
	require.Equal(t, carotation.PhaseRetired, s.State.Phase)
	require.Len(t, s.Bundle, 1)
	require.Eventually(t, func() bool { return renewOperator() == 1 }, 40*time.Second, 200*time.Millisecond, "renewal drops the old CA")
	renewAgent(agent)
	stale := &rotClient{name: "stale"}
	stale.setRoots(t, newCA.CertPEM)
	stale.cert.Store(oldAgentCert)
	require.Eventually(t, func() bool {
		refused := 0
		for _, srv := range st.servers {
			_, err := stale.handshake(srv.host, srv.addr(8994), true)
			if err == nil {
				return false
			}
			if !errors.Is(err, errNotServing) {
				refused++ // the leader's Agent port refused the certificate
			}
		}
		return refused > 0
	}, 40*time.Second, 200*time.Millisecond, "control: an agent certificate of the retired CA is refused")
	time.Sleep(time.Second)

	stop()
	t.Logf("handshakes: %d attempted, %d completed, %d failed", attempts.Load(), served.Load(), failures.Load())
	require.Zero(t, failures.Load(), "failed handshakes: %v", firstFailures)
	require.Greater(t, served.Load(), int64(200))
}
