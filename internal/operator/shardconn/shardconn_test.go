package shardconn

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/registration"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const clusterID = "c1"

// server is a real operator API listener (the server's core RPCs) that can be
// stopped and started again on the same address.
type server struct {
	t     *testing.T
	ca    *pki.CA
	shard string
	addr  string
	srv   *grpcserve.Servers
}

func startServer(t *testing.T, ca *pki.CA, shard, addr string) *server {
	t.Helper()
	s := &server{t: t, ca: ca, shard: shard, addr: addr}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *server) start() {
	t := s.t
	cert, err := s.ca.ServerKeyPair(pki.ServerIdentity{Shard: s.shard, ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	var ln net.Listener
	require.Eventually(t, func() bool {
		ln, err = net.Listen("tcp", s.addr)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
	s.addr = ln.Addr().String()
	issuer := &registration.Issuer{CA: s.ca, ClusterID: clusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour}
	s.srv, err = grpcserve.Start(grpcserve.Config{
		ClusterID: clusterID, ServerCert: cert, ClientCAs: s.ca.Pool(),
		Operator: operatorsvc.New(operatorsvc.Options{Shard: s.shard, Issuer: issuer}),
	}, grpcserve.Listeners{Operator: ln})
	require.NoError(t, err)
}

func (s *server) stop() {
	if s.srv != nil {
		s.srv.Stop()
		s.srv = nil
	}
}

func operatorCreds(t *testing.T, ca *pki.CA, validity time.Duration) *bootstrap.Credentials {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, certPEM, err := ca.IssueClient(pki.ClientRequest{
		Identity:  pki.Identity{ClusterID: clusterID, Tenant: "default", Role: pki.RoleOperator, ClientID: "op"},
		PublicKey: pub, Validity: validity,
	}, time.Now())
	require.NoError(t, err)
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	require.NoError(t, err)
	creds, err := bootstrap.Parse(ca.CertPEM, certPEM, keyPEM, clusterID, time.Now())
	require.NoError(t, err)
	creds.PublicKeyPEM, err = pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	return creds
}

// changes records health transitions.
type changes struct {
	mu  sync.Mutex
	log []string
}

func (c *changes) add(shard string, up bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := shard + "=down"
	if up {
		s = shard + "=up"
	}
	c.log = append(c.log, s)
}

func (c *changes) has(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.log {
		if v == s {
			return true
		}
	}
	return false
}

func TestHealthFollowsShards(t *testing.T) {
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	a := startServer(t, ca, "a", "127.0.0.1:0")
	b := startServer(t, ca, "b", "127.0.0.1:0")
	m := New(Options{Shards: map[string]string{"a": a.addr, "b": b.addr}, MaxBackoff: 200 * time.Millisecond, ClusterID: clusterID, Log: logr.Discard()})
	var ch changes
	m.OnChange(ch.add)

	require.Empty(t, m.Down(), "nothing is down before Start (a standby)")
	_, err = m.Client("a")
	require.ErrorIs(t, err, ErrNotStarted)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	require.NoError(t, m.Start(ctx, operatorCreds(t, ca, time.Hour)))
	require.Eventually(t, func() bool { return m.Healthy("a") && m.Healthy("b") }, 10*time.Second, 20*time.Millisecond)
	require.Empty(t, m.Down())
	_, err = m.Client("zz")
	require.ErrorIs(t, err, ErrUnknownShard)

	// An mTLS call works with the operator certificate.
	c, err := m.Client("b")
	require.NoError(t, err)
	resp, err := c.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	require.Equal(t, "b", resp.GetShard())

	// Stopping b degrades only b.
	b.stop()
	require.Eventually(t, func() bool { return !m.Healthy("b") }, 10*time.Second, 20*time.Millisecond)
	require.True(t, m.Healthy("a"))
	require.True(t, ch.has("b=down"))
	require.Equal(t, []string{"b"}, m.Down())

	// Restarting b on the same address recovers it through backoff redials.
	b.start()
	require.Eventually(t, func() bool { return m.Healthy("b") }, 15*time.Second, 20*time.Millisecond)
	require.Empty(t, m.Down())
	require.NoError(t, m.WaitReady(ctx, "b"))
}

// TestServerOfAnotherShardIsRefused: a connection configured for shard "a"
// whose address reaches a server of shard "b" (same cluster CA) is refused
// in the handshake, while b's own connection works.
func TestServerOfAnotherShardIsRefused(t *testing.T) {
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	b := startServer(t, ca, "b", "127.0.0.1:0")
	m := New(Options{Shards: map[string]string{"a": b.addr, "b": b.addr}, MaxBackoff: 200 * time.Millisecond, ClusterID: clusterID, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	require.NoError(t, m.Start(ctx, operatorCreds(t, ca, time.Hour)))
	require.Eventually(t, func() bool { return m.Healthy("b") }, 10*time.Second, 20*time.Millisecond)
	c, err := m.Client("a")
	require.NoError(t, err)
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	_, err = c.GetConfigStatus(cctx, &nstancev1.GetConfigStatusRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), `authentication handshake failed: nstance server: spiffe://`+clusterID+`/shard/b/server/nstance-server serves shard \"b\", not \"a\"`)
	require.False(t, m.Healthy("a"))
}

func TestRenewalBeforeExpiry(t *testing.T) {
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	a := startServer(t, ca, "a", "127.0.0.1:0")
	stored := make(chan []byte, 4)
	m := New(Options{
		Shards: map[string]string{"a": a.addr}, ClusterID: clusterID, Log: logr.Discard(),
		StoreCert: func(_ context.Context, certPEM, _, _ []byte) error { stored <- certPEM; return nil },
	})
	// A certificate with 20 s left of a 5 min lifetime is past the renewal point.
	first := operatorCreds(t, ca, 20*time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	require.NoError(t, m.Start(ctx, first))

	var renewed []byte
	select {
	case renewed = <-stored:
	case <-time.After(20 * time.Second):
		t.Fatal("certificate was not renewed")
	}
	cur := m.Certificate()
	require.Equal(t, renewed, cur.CertPEM)
	require.True(t, cur.Leaf.NotAfter.After(first.Leaf.NotAfter.Add(30*time.Minute)))
	require.Equal(t, first.KeyPEM, cur.KeyPEM, "same key")
	// No second renewal right away: the new certificate is fresh.
	select {
	case <-stored:
		t.Fatal("renewed twice")
	case <-time.After(300 * time.Millisecond):
	}
}

func TestRenewAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		fraction float64
		want     time.Duration
	}{
		{0, 2 * time.Hour},
		{0.5, 90 * time.Minute},
		{1.5, 2 * time.Hour},
	}
	for _, tt := range tests {
		require.Equal(t, nb.Add(tt.want), renewAt(nb, nb.Add(3*time.Hour), tt.fraction))
	}
}
