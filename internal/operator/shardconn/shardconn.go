package shardconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/nstance-dev/nstance/internal/msgsize"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Errors returned by Client.
var (
	ErrNotStarted   = errors.New("shard connections are not established yet")
	ErrUnknownShard = errors.New("shard is not in the operator configuration")
)

// CertStore persists a renewed certificate (the certificate Secret).
type CertStore func(ctx context.Context, certPEM, keyPEM, caPEM []byte) error

// Options configure a Manager.
type Options struct {
	// Shards maps shard IDs to operator API addresses (host:port).
	Shards map[string]string
	// MaxBackoff caps the redial delay; zero means 10 seconds.
	MaxBackoff time.Duration
	// RenewFraction of the certificate lifetime after which it is renewed;
	// zero means 2/3.
	RenewFraction float64
	// StoreCert saves renewed certificates; nil skips saving.
	StoreCert CertStore
	// ClusterID is checked on renewed certificates.
	ClusterID string
	Metrics   *metrics.Metrics
	Log       logr.Logger
	// DialOptions are added to every shard connection's own (tests record
	// the calls the operator makes with an interceptor).
	DialOptions []grpc.DialOption
}

type shard struct {
	id     string
	addr   string
	conn   *grpc.ClientConn
	client nstancev1.OperatorServiceClient
}

// Manager owns the shard connections.
type Manager struct {
	opts Options
	ids  []string

	started     chan struct{}
	startedOnce sync.Once

	mu        sync.RWMutex
	shards    map[string]*shard
	up        map[string]bool
	creds     *bootstrap.Credentials
	listeners []func(shard string, up bool)
}

// New returns a Manager for the given shards. Call Start to connect.
func New(opts Options) *Manager {
	ids := make([]string, 0, len(opts.Shards))
	for id := range opts.Shards {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return &Manager{opts: opts, ids: ids, started: make(chan struct{}), shards: map[string]*shard{}, up: map[string]bool{}}
}

// ShardIDs returns the configured shards in lexical order.
func (m *Manager) ShardIDs() []string { return slices.Clone(m.ids) }

// Known reports whether id is a configured shard.
func (m *Manager) Known(id string) bool {
	_, ok := m.opts.Shards[id]
	return ok
}

// OnChange registers fn to be called (from a monitor goroutine) whenever a
// shard's health changes. Register before Start to see every change.
func (m *Manager) OnChange(fn func(shard string, up bool)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners = append(m.listeners, fn)
}

// WaitStarted blocks until Start completed or ctx ends.
func (m *Manager) WaitStarted(ctx context.Context) error {
	select {
	case <-m.started:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Start dials every shard with creds and keeps the connections until ctx
// ends. It returns once all connections are created (not necessarily up).
func (m *Manager) Start(ctx context.Context, creds *bootstrap.Credentials) error {
	m.mu.Lock()
	m.creds = creds
	m.mu.Unlock()
	maxBackoff := m.opts.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = 10 * time.Second
	}
	for _, id := range m.ids {
		addr := m.opts.Shards[id]
		// The server must serve the shard this connection is configured for;
		// roots are read at each handshake: a renewal may bring a new CA bundle.
		tlsCfg := pki.ClientTLSDynamic(func() *x509.CertPool {
			m.mu.RLock()
			defer m.mu.RUnlock()
			return m.creds.Roots
		}, nil, bootstrap.ServerName(addr), pki.VerifyServerOfShard(id))
		tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m.mu.RLock()
			defer m.mu.RUnlock()
			c := m.creds.Certificate
			return &c, nil
		}
		dialOpts := append([]grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), msgsize.DialOption(),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxBackoff},
				MinConnectTimeout: 5 * time.Second,
			}),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		}, m.opts.DialOptions...)
		conn, err := grpc.NewClient(addr, dialOpts...)
		if err != nil {
			m.closeAll()
			return fmt.Errorf("create connection to shard %s (%s): %w", id, addr, err)
		}
		s := &shard{id: id, addr: addr, conn: conn, client: nstancev1.NewOperatorServiceClient(conn)}
		m.mu.Lock()
		m.shards[id] = s
		m.mu.Unlock()
		m.opts.Metrics.SetShardUp(id, false)
	}
	for _, id := range m.ids {
		s := m.shards[id]
		go m.monitor(ctx, s)
	}
	go func() {
		<-ctx.Done()
		m.closeAll()
	}()
	go m.renewLoop(ctx)
	m.startedOnce.Do(func() { close(m.started) })
	return nil
}

func (m *Manager) closeAll() {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, s := range m.shards {
		_ = s.conn.Close()
	}
}

// monitor follows a connection's state. gRPC leaves a connection IDLE after
// it drops; monitor asks it to reconnect so health recovers without waiting
// for an RPC.
func (m *Manager) monitor(ctx context.Context, s *shard) {
	s.conn.Connect()
	for {
		st := s.conn.GetState()
		m.setUp(s.id, st == connectivity.Ready)
		switch st {
		case connectivity.Idle:
			s.conn.Connect()
		case connectivity.Shutdown:
			m.setUp(s.id, false)
			return
		}
		if !s.conn.WaitForStateChange(ctx, st) {
			return
		}
	}
}

func (m *Manager) setUp(id string, up bool) {
	m.mu.Lock()
	was, seen := m.up[id]
	m.up[id] = up
	listeners := slices.Clone(m.listeners)
	m.mu.Unlock()
	if seen && was == up {
		return
	}
	if !seen && !up {
		// Initial "not yet connected" is not a change worth reporting.
		m.opts.Metrics.SetShardUp(id, false)
		return
	}
	m.opts.Metrics.SetShardUp(id, up)
	m.opts.Log.Info("shard health changed", "shard", id, "up", up)
	for _, fn := range listeners {
		fn(id, up)
	}
}

// Healthy reports whether the shard's connection is ready.
func (m *Manager) Healthy(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.up[id]
}

// Client returns the operator API client of a shard. Calls on it fail fast
// while the shard is down.
func (m *Manager) Client(id string) (nstancev1.OperatorServiceClient, error) {
	if !m.Known(id) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownShard, id)
	}
	select {
	case <-m.started:
	default:
		return nil, ErrNotStarted
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.shards[id].client, nil
}

// WaitReady blocks until the shard's connection is ready or ctx ends.
func (m *Manager) WaitReady(ctx context.Context, id string) error {
	if err := m.WaitStarted(ctx); err != nil {
		return err
	}
	m.mu.RLock()
	s, ok := m.shards[id]
	m.mu.RUnlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownShard, id)
	}
	for {
		st := s.conn.GetState()
		if st == connectivity.Ready {
			return nil
		}
		if st == connectivity.Shutdown {
			return fmt.Errorf("connection to shard %s is closed", id)
		}
		if !s.conn.WaitForStateChange(ctx, st) {
			return ctx.Err()
		}
	}
}

// Certificate returns the client certificate currently in use.
func (m *Manager) Certificate() *bootstrap.Credentials {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.creds
}

// Down returns the configured shards whose connection is not ready, in
// lexical order; nil before Start (a standby replica, or a leader still
// registering). It does not gate readiness: the operator's readiness is its
// webhook server (internal/operator/manager), and a shard outage shows in
// nstance_operator_shard_up and the shard groups' ShardReachable condition.
func (m *Manager) Down() []string {
	select {
	case <-m.started:
	default:
		return nil
	}
	var down []string
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, id := range m.ids {
		if !m.up[id] {
			down = append(down, id)
		}
	}
	return down
}

// Clients reaches the shards' Operator API; *Manager is one, tests hand in
// direct clients.
type Clients interface {
	ShardIDs() []string
	Client(shard string) (nstancev1.OperatorServiceClient, error)
}

// ListTimeout bounds one ListInstances call of ListInstances.
const ListTimeout = 10 * time.Second

// ListInstances returns every instance the operator's tenant has on shard,
// in one call bounded by ListTimeout.
func ListInstances(ctx context.Context, c Clients, shard string) ([]*nstancev1.InstanceStatus, error) {
	cl, err := c.Client(shard)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, ListTimeout)
	defer cancel()
	resp, err := cl.ListInstances(lctx, &nstancev1.ListInstancesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListInstances on shard %s: %w", shard, err)
	}
	return resp.GetInstances(), nil
}
