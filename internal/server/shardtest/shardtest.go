package shardtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Options configures a fake shard. Zero values pick test defaults.
type Options struct {
	// ClusterID defaults to "test-cluster"; ShardID to "test-1".
	ClusterID, ShardID string
	// ConfigJSONC is the shard config; default Config(ClusterID, ShardID, "mock").
	ConfigJSONC string
	// Store defaults to a fresh in-memory store. Pass the store of a stopped
	// shard to simulate a server restart.
	Store objstore.Store
	// Provider defaults to a fresh mock provider.
	Provider provider.Provider
	// CA defaults to a fresh test CA (reuse one across a restart so old client certificates still work).
	CA *pki.CA
	// WorkloadCA defaults to a fresh workload CA (signs template certificates).
	WorkloadCA *pki.CA
	// ResyncInterval defaults to 200ms; RetryBase to 50ms.
	ResyncInterval, RetryBase time.Duration
	Log                       logr.Logger
	// Agents also serves the Registration and Agent services (TLS, mTLS)
	// so real agents can join; health monitoring is on.
	Agents bool
	// Agent tunes the Agent service and health monitoring (WorkloadCA and Monitor are set by Start).
	Agent app.Tuning
	// RequireOperatorRecords admits operator and admin certificates only
	// while their record exists, as nstance-server does (off by default:
	// many tests dial with certificates issued straight from the CA; the
	// client helpers here write records).
	RequireOperatorRecords bool
}

// Shard is a running fake shard.
type Shard struct {
	ClusterID, ShardID string
	// OperatorAddr is the mTLS Operator endpoint (127.0.0.1:port).
	OperatorAddr string
	// RegistrationAddr and AgentAddr are set with Options.Agents.
	RegistrationAddr, AgentAddr string
	CA                          *pki.CA
	WorkloadCA                  *pki.CA
	// NonceKey signs registration nonces (tests mint their own with it).
	NonceKey ed25519.PrivateKey
	Store    objstore.Store
	Keys     layout.Keys
	Provider provider.Provider
	Fleet    *app.Assembly
	Config   *liveconfig.Holder
	// Revocations is the deny list the mTLS listeners consult.
	Revocations *revocation.Gate

	servers  *grpcserve.Servers
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// Config returns a valid test shard config using the given provider kind.
// Template "worker" (instance type test.small, subnet pool "default"),
// default drain timeout 30s, no create rate limit, no expiry.
func Config(clusterID, shardID, providerKind string) string {
	return fmt.Sprintf(`{
  // fake shard config
  "cluster": { "id": %q, "storage": { "kind": "s3", "bucket": "test" } },
  "shard": {
    "id": %q,
    "infra": { "provider": %q, "region": "test", "zone": "testa" },
    "bind": {
      "health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": "127.0.0.1:0",
      "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0",
    },
    "default_drain_timeout": "30s",
    "subnet_pools": { "default": { "subnets": ["test-subnet-a"] } },
  },
  "defaults": { "vars": { "environment": "test" } },
  "templates": {
    "worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" } },
  },
  "groups": {},
}`, clusterID, shardID, providerKind)
}

// Start runs a fake shard until the test ends.
func Start(t testing.TB, o Options) *Shard {
	t.Helper()
	sh, err := start(o)
	if err != nil {
		t.Fatalf("starting fake shard: %v", err)
	}
	t.Cleanup(sh.Stop)
	return sh
}

func start(o Options) (*Shard, error) {
	if o.ClusterID == "" {
		o.ClusterID = "test-cluster"
	}
	if o.ShardID == "" {
		o.ShardID = "test-1"
	}
	if o.ConfigJSONC == "" {
		o.ConfigJSONC = Config(o.ClusterID, o.ShardID, "mock")
	}
	if o.Store == nil {
		o.Store = memstore.New()
	}
	if o.Provider == nil {
		o.Provider = mock.New()
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 200 * time.Millisecond
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 50 * time.Millisecond
	}
	ctx := context.Background()
	now := time.Now()
	ca := o.CA
	if ca == nil {
		var err error
		if ca, err = pki.GenerateCA(o.ClusterID, 24*time.Hour, now); err != nil {
			return nil, err
		}
	}
	wca := o.WorkloadCA
	if wca == nil {
		var err error
		if wca, err = pki.GenerateWorkloadCA(o.ClusterID, 24*time.Hour, now); err != nil {
			return nil, err
		}
	}
	keys := layout.New("")
	cfgKey := keys.Config(o.ShardID)
	// Keep a config already in storage (restart); otherwise upload ours.
	obj, err := o.Store.Get(ctx, cfgKey)
	if err != nil {
		if _, err := o.Store.Put(ctx, cfgKey, []byte(o.ConfigJSONC), objstore.PutOptions{}); err != nil {
			return nil, fmt.Errorf("uploading config: %w", err)
		}
		if obj, err = o.Store.Get(ctx, cfgKey); err != nil {
			return nil, err
		}
	}
	if _, err := o.Store.Put(ctx, keys.CACert(), ca.CertPEM, objstore.PutOptions{}); err != nil {
		return nil, fmt.Errorf("uploading CA: %w", err)
	}
	cfg, err := config.Parse(obj.Body)
	if err != nil {
		return nil, fmt.Errorf("test config: %w", err)
	}
	_, nonceKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	var lns []net.Listener
	closeAll := func() {
		for _, l := range lns {
			l.Close()
		}
	}
	listen := func() (net.Listener, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			lns = append(lns, l)
		}
		return l, err
	}
	ln, err := listen()
	if err != nil {
		return nil, err
	}
	regAddr, agentAddr := "127.0.0.1:0", "127.0.0.1:0"
	var regLn, agentLn net.Listener
	if o.Agents {
		if regLn, err = listen(); err != nil {
			closeAll()
			return nil, err
		}
		if agentLn, err = listen(); err != nil {
			closeAll()
			return nil, err
		}
		regAddr, agentAddr = regLn.Addr().String(), agentLn.Addr().String()
	}
	gate := revocation.New(revocation.Options{
		Store: o.Store, Keys: keys, ClusterID: o.ClusterID, Shard: o.ShardID, ServerID: "shardtest",
		OperatorValidity: time.Hour, AgentValidity: time.Hour, RequireOperatorRecords: o.RequireOperatorRecords,
		Log: o.Log.WithName("revocation"),
	})
	if err := gate.Sync(ctx); err != nil {
		closeAll()
		return nil, fmt.Errorf("loading revocations: %w", err)
	}
	issuer := &registration.Issuer{CA: ca, ClusterID: o.ClusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour}
	cfg.Shard.Advertise.RegistrationAddr, cfg.Shard.Advertise.AgentAddr = regAddr, agentAddr
	trust, err := pki.NewTrust(ca, nil)
	if err != nil {
		closeAll()
		return nil, err
	}
	tuning := o.Agent
	tuning.ResyncInterval, tuning.RetryBase = o.ResyncInterval, o.RetryBase
	tuning.MonitorMock = o.Agents
	parts := app.Parts{Config: cfg, ConfigETag: obj.ETag, ConfigModified: obj.LastModified, Store: o.Store, Keys: keys, ServerID: "shardtest",
		Provider: o.Provider, Trust: trust, Issuer: issuer, NonceKey: nonceKey, Revocations: gate, Tuning: tuning, Log: o.Log}
	if o.Agents {
		parts.WorkloadCA = wca
	}
	f, err := app.Assemble(parts)
	if err != nil {
		closeAll()
		return nil, err
	}
	serverCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: o.ShardID, ServerID: "nstance-server-" + o.ShardID}, []string{"127.0.0.1", "localhost"}, 24*time.Hour, now)
	if err != nil {
		closeAll()
		return nil, err
	}
	gcfg := grpcserve.Config{ClusterID: o.ClusterID, ServerCert: serverCert, ClientCAs: ca.Pool(), Operator: f.Operator, Log: o.Log.WithName("grpc"),
		Limits: cfg.Shard.Limits}
	gls := grpcserve.Listeners{Operator: ln}
	gcfg.Gate = gate
	if o.Agents {
		gcfg.Registration = f.Registration
		gcfg.Agent = f.Agent
		gls.Registration, gls.Agent = regLn, agentLn
	}
	servers, err := grpcserve.Start(gcfg, gls)
	if err != nil {
		closeAll()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	sh := &Shard{ClusterID: o.ClusterID, ShardID: o.ShardID, OperatorAddr: ln.Addr().String(), CA: ca, WorkloadCA: wca, NonceKey: nonceKey, Store: o.Store, Keys: keys,
		RegistrationAddr: regAddr, AgentAddr: agentAddr,
		Provider: o.Provider, Fleet: f, Config: f.Config, Revocations: gate, servers: servers, cancel: cancel, done: make(chan error, 1)}
	go func() { sh.done <- f.Lead(runCtx) }()
	go gate.Run(runCtx, 100*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for !f.Reconciler.Running() {
		select {
		case err := <-sh.done:
			servers.Stop()
			return nil, fmt.Errorf("reconciler stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			sh.Stop()
			return nil, fmt.Errorf("reconciler did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return sh, nil
}

// Stop stops the reconciler and the listener. Instances stay at the provider
// and records in storage, as after a server crash.
func (s *Shard) Stop() {
	s.stopOnce.Do(func() {
		s.servers.Stop()
		s.cancel()
		<-s.done
		s.Fleet.Events.Close()
	})
}

// ClientTLS returns a TLS config with a fresh operator certificate for tenant.
func (s *Shard) ClientTLS(tenant string) (*tls.Config, error) {
	return s.ClientTLSAs(tenant, pki.RoleOperator)
}

// ClientTLSAs returns a TLS config with a fresh certificate of role
// (operator or admin) for tenant, whose operator id is "<role>-<tenant>".
func (s *Shard) ClientTLSAs(tenant string, role pki.Role) (*tls.Config, error) {
	return s.OperatorTLS(tenant, role, string(role)+"-"+strings.ToLower(tenant))
}

// OperatorTLS issues a certificate of role (operator or admin) for operator
// id of tenant, writes its operator record as registration does, and
// returns a client TLS config presenting it.
func (s *Shard) OperatorTLS(tenant string, role pki.Role, id string) (*tls.Config, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	ident := pki.Identity{ClusterID: s.ClusterID, Tenant: tenant, Role: role, ClientID: id}
	cert, _, err := s.CA.IssueClient(pki.ClientRequest{Identity: ident, PublicKey: pub, Validity: time.Hour}, time.Now())
	if err != nil {
		return nil, err
	}
	rec, err := json.Marshal(registration.OperatorRecord{ID: id, Tenant: tenant, Role: string(role), URI: ident.URI().String(),
		Serial: cert.SerialNumber.String(), ExpiresAt: cert.NotAfter, RegisteredAt: time.Now().UTC(), RegisteredBy: "shardtest"})
	if err != nil {
		return nil, err
	}
	if _, err := s.Store.Put(context.Background(), s.Keys.Operator(id), rec, objstore.PutOptions{}); err != nil {
		return nil, fmt.Errorf("writing operator record: %w", err)
	}
	tc := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv, Leaf: cert}
	return pki.ClientTLS(s.CA.Pool(), &tc, "127.0.0.1"), nil
}

// Dial opens an mTLS connection as an operator of tenant.
func (s *Shard) Dial(tenant string) (*grpc.ClientConn, error) {
	tc, err := s.ClientTLS(tenant)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(s.OperatorAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
}

// Client returns an Operator client for tenant, closed when the test ends.
func (s *Shard) Client(t testing.TB, tenant string) nstancev1.OperatorServiceClient {
	t.Helper()
	return s.ClientAs(t, tenant, pki.RoleOperator)
}

// AdminClient returns an Operator client with an admin certificate of tenant.
func (s *Shard) AdminClient(t testing.TB, tenant string) nstancev1.OperatorServiceClient {
	t.Helper()
	return s.ClientAs(t, tenant, pki.RoleAdmin)
}

// ClientAs returns an Operator client with a certificate of role for tenant.
func (s *Shard) ClientAs(t testing.TB, tenant string, role pki.Role) nstancev1.OperatorServiceClient {
	t.Helper()
	tc, err := s.ClientTLSAs(tenant, role)
	if err != nil {
		t.Fatalf("client certificate: %v", err)
	}
	conn, err := grpc.NewClient(s.OperatorAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatalf("dialing fake shard: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return nstancev1.NewOperatorServiceClient(conn)
}
