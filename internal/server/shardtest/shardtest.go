package shardtest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/bootstrap"
	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Options configures a fake shard. Zero values pick test defaults.
type Options struct {
	// ClusterID defaults to "test-cluster"; ShardID to "test-1".
	ClusterID, ShardID string
	// ConfigJSONC is the shard config; default Config(ClusterID, ShardID, "mock").
	// A config already in Store is kept (a restart).
	ConfigJSONC string
	// Store defaults to a fresh in-memory store. Pass the store of a
	// stopped shard to simulate a server restart.
	Store objstore.Store
	// Provider defaults to a fresh mock provider.
	Provider provider.Provider
	// CA is the cluster CA written to Store before the server starts (reuse
	// one across a restart or shards so old client certificates still work);
	// default: the one bootstrap creates.
	CA *pki.CA
	// WorkloadCA is written as the shared workload CA of a cluster from
	// before per-tenant CAs (it signs nothing; every tenant's bundle holds
	// it during the transition); default: none.
	WorkloadCA *pki.CA
	// ResyncInterval defaults to 200ms; RetryBase to 50ms.
	ResyncInterval, RetryBase time.Duration
	Log                       logr.Logger
	// Agent tunes the reconciler and the Agent service (ResyncInterval and
	// RetryBase are taken from the fields above).
	Agent app.Tuning
	// RequireOperatorRecords admits operator and admin certificates only
	// while their record exists, as nstance-server does (off by default:
	// many tests dial with certificates issued straight from the CA; the
	// client helpers here write records).
	RequireOperatorRecords bool
	// Remote replaces the AWS Secrets Manager / SSM clients (secret files
	// of those sources); nil keeps the SDK's.
	Remote secrets.Remote
	// ServerID defaults to "shardtest"; servers sharing a Store need
	// their own.
	ServerID string
	// LeaderAddress replaces the holder of the shard's fixed address
	// (app.Options.LeaderAddress).
	LeaderAddress leaderaddr.Holder
	// Standby makes Start return once the server is assembled and
	// campaigning, not leading (another server of Store leads): Addrs and
	// the CA fields stay empty.
	Standby bool
	// OperatorAddr is where the Operator service listens; default
	// 127.0.0.1:0. A restart passes the stopped shard's OperatorAddr, so
	// clients configured with it reconnect.
	OperatorAddr string
}

// Shard is a running shard server (app.App) with test helpers.
type Shard struct {
	ClusterID, ShardID string
	// OperatorAddr is the mTLS Operator endpoint (127.0.0.1:port);
	// RegistrationAddr (TLS) and AgentAddr (mTLS) the other two.
	OperatorAddr, RegistrationAddr, AgentAddr string
	// CA is the cluster CA; WorkloadCA the shared workload CA of
	// Options.WorkloadCA (a cluster from before per-tenant CAs), else nil:
	// template certificates come from each tenant's CA (TenantWorkloadCA).
	CA         *pki.CA
	WorkloadCA *pki.CA
	// NonceKey signs registration nonces (tests mint their own with it).
	NonceKey ed25519.PrivateKey
	Store    objstore.Store
	Keys     layout.Keys
	// Provider is the provider the server drives (unfenced).
	Provider provider.Provider
	// App is the running server; Assembly what it built (instance records,
	// reconciler, services); Config its live config.
	App      *app.App
	Assembly *app.Assembly
	Config   *liveconfig.Holder
	// Revocations is the deny list the mTLS listeners consult.
	Revocations *revocation.Gate

	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// EncryptionKey is the cluster encryption key of every test shard
// (NSTANCE_ENCRYPTION_KEY of the server).
const EncryptionKey = "shardtest-encryption-key-32bytes"

// Config returns a valid test shard config using the given provider kind.
// Template "worker" (instance type test.small, subnet pool "default"),
// default drain timeout 30s, no create rate limit, no expiry; bootstrap
// retries every 100ms, revocations are re-read every 100ms and a stopping
// server waits at most 100ms for open calls and streams (agents' streams
// never end by themselves).
func Config(clusterID, shardID, providerKind string) string {
	return fmt.Sprintf(`{
  // fake shard config
  "cluster": { "id": %q, "storage": { "kind": "s3", "bucket": "test" }, "leader_election": { "retry_interval": "100ms" } },
  "certificates": { "revocation_sync_interval": "100ms" },
  "shard": {
    "id": %q,
    "infra": { "provider": %q, "region": "test", "zone": "testa" },
    "bind": {
      "health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": "127.0.0.1:0",
      "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0",
    },
    "default_drain_timeout": "30s",
    "timeouts": { "shutdown": "100ms" },
    "subnet_pools": { "default": { "subnets": ["test-subnet-a"] } },
  },
  "defaults": { "vars": { "environment": "test" } },
  "templates": {
    "worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" } },
  },
  "instance_types": { "test.small": { "vcpus": 2, "memory_mib": 4096, "ephemeral_storage_gib": 20 } },
  "groups": {},
}`, clusterID, shardID, providerKind)
}

// Start runs a shard server until the test ends.
func Start(t testing.TB, o Options) *Shard {
	t.Helper()
	if o.Store == nil {
		// In memory: a file store fsyncs every write (bootstrap, leases,
		// records), which took a loaded CI machine past the 30s start
		// bound; durability is not what these tests are about.
		o.Store = memstore.New()
	}
	// Agents started by the provider are told the Registration and Agent
	// addresses when their instance is created, before the listeners exist:
	// pick the ports now (outside the kernel's ephemeral range, held for
	// the test, so no other socket takes them in between).
	sh, err := start(o, portpick.Addr(t), portpick.Addr(t))
	if err != nil {
		t.Fatalf("starting test shard: %v", err)
	}
	t.Cleanup(sh.Stop)
	return sh
}

func start(o Options, regAddr, agentAddr string) (*Shard, error) {
	if o.ClusterID == "" {
		o.ClusterID = "test-cluster"
	}
	if o.ShardID == "" {
		o.ShardID = "test-1"
	}
	if o.ConfigJSONC == "" {
		o.ConfigJSONC = Config(o.ClusterID, o.ShardID, "mock")
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
	keys := layout.New("")
	secretStore, err := secretStore(o.Store)
	if err != nil {
		return nil, err
	}
	// Keep a config already in storage (restart); otherwise upload ours.
	if _, err := o.Store.Put(ctx, keys.Config(o.ShardID), []byte(o.ConfigJSONC), objstore.PutOptions{IfNoneMatch: true}); err != nil &&
		!errors.Is(err, objstore.ErrPreconditionFailed) {
		return nil, fmt.Errorf("uploading config: %w", err)
	}
	if err := seedCA(ctx, o.Store, secretStore, o.CA, keys.CACert(), keys.CAKey()); err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	if err := seedCA(ctx, o.Store, secretStore, o.WorkloadCA, keys.WorkloadCACert(), keys.WorkloadCAKey()); err != nil {
		return nil, fmt.Errorf("workload CA: %w", err)
	}
	// Without a logger of the caller's, keep the server's recent log lines
	// to explain a start that fails.
	var tail *tailWriter
	if o.Log.GetSink() == nil {
		tail = &tailWriter{max: 16 << 10}
		l, _, err := logging.New(logging.Options{Level: "info", Format: logging.FormatText}, tail)
		if err != nil {
			return nil, err
		}
		o.Log = l
	}
	startErr := func(err error) error {
		if tail == nil {
			return err
		}
		return fmt.Errorf("%w; the server's last log lines:\n%s", err, tail.String())
	}
	tuning := o.Agent
	tuning.ResyncInterval, tuning.RetryBase = o.ResyncInterval, o.RetryBase
	a, err := app.New(app.Options{
		ServerID: cmp.Or(o.ServerID, "shardtest"), Shard: o.ShardID, LeaderAddress: o.LeaderAddress, Store: o.Store, Keys: keys,
		AdvertiseHosts: []string{"127.0.0.1"},
		Bind: app.BindOverrides{Health: "127.0.0.1:0", Election: "127.0.0.1:0", Operator: cmp.Or(o.OperatorAddr, "127.0.0.1:0"),
			Registration: regAddr, Agent: agentAddr},
		Getenv:   func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": EncryptionKey}[k] },
		Log:      o.Log,
		Provider: o.Provider, Tuning: tuning, OperatorRecordsOptional: !o.RequireOperatorRecords,
		StorageBackoff: storage.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		TrustRefresh:   time.Second,
		Remote:         o.Remote,
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	sh := &Shard{ClusterID: o.ClusterID, ShardID: o.ShardID, Store: o.Store, Keys: keys, Provider: o.Provider, App: a,
		cancel: cancel, done: make(chan error, 1)}
	go func() { sh.done <- a.Run(runCtx) }()
	// Serving: elected, bootstrapped, listeners up and the reconciler running.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b := a.Assembly(); o.Standby && b != nil {
			sh.Assembly, sh.Config, sh.Revocations = b, b.Config, b.Revocations
			return sh, nil
		}
		if a.ServingGRPC() {
			if b := a.Assembly(); b != nil && b.Reconciler.Running() {
				break
			}
		}
		select {
		case err := <-sh.done:
			cancel()
			return nil, startErr(fmt.Errorf("server stopped: %v", err))
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			sh.Stop()
			return nil, startErr(errors.New("the server did not become shard leader within 30s"))
		}
	}
	cl, err := bootstrap.Once(ctx, bootstrap.Options{ClusterID: o.ClusterID, Objects: o.Store, Secrets: secretStore, Keys: keys})
	if err != nil {
		sh.Stop()
		return nil, fmt.Errorf("reading the cluster material: %w", err)
	}
	ad := a.Addrs()
	b := a.Assembly()
	sh.OperatorAddr, sh.RegistrationAddr, sh.AgentAddr = ad.Operator, ad.Registration, ad.Agent
	sh.CA, sh.WorkloadCA, sh.NonceKey = cl.CA, o.WorkloadCA, cl.NonceKey
	sh.Assembly, sh.Config, sh.Revocations = b, b.Config, b.Revocations
	return sh, nil
}

// TenantWorkloadCA is the workload CA certificate of tenant as stored (it
// exists once the tenant's first instance needed it), or nil.
func (s *Shard) TenantWorkloadCA(ctx context.Context, tenant string) (*x509.Certificate, error) {
	obj, err := s.Store.Get(ctx, s.Keys.TenantWorkloadCACert(tenant))
	if err != nil {
		return nil, err
	}
	return pki.ParseCertificatePEM(obj.Body)
}

// secretStore seals with EncryptionKey, as the test servers do.
func secretStore(objects objstore.Store) (*secrets.Store, error) {
	k, err := secrets.ParseKey([]byte(EncryptionKey))
	if err != nil {
		return nil, err
	}
	ring, err := secrets.NewKeyring(k)
	if err != nil {
		return nil, err
	}
	return &secrets.Store{Objects: objects, Ring: ring}, nil
}

// seedCA writes ca (certificate and sealed key) where bootstrap looks for
// it, unless it is already there; a different CA already there is an error.
func seedCA(ctx context.Context, objects objstore.Store, sec *secrets.Store, ca *pki.CA, certKey, keyKey string) error {
	if ca == nil {
		return nil
	}
	if obj, err := objects.Get(ctx, certKey); err == nil {
		if !bytes.Equal(obj.Body, ca.CertPEM) {
			return fmt.Errorf("%s holds another CA than Options asks for", certKey)
		}
		return nil
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(ca.Key)
	if err != nil {
		return err
	}
	if err := sec.Put(ctx, keyKey, keyPEM, objstore.PutOptions{}); err != nil {
		return fmt.Errorf("writing %s: %w", keyKey, err)
	}
	if _, err := objects.Put(ctx, certKey, ca.CertPEM, objstore.PutOptions{}); err != nil {
		return fmt.Errorf("writing %s: %w", certKey, err)
	}
	return nil
}

// Stop stops the server. Instances stay at the provider and records in
// storage; the shard lease is released, so a server started on the same
// store takes over at once. Watch streams end first (Unavailable), so the
// graceful stop does not wait for them.
func (s *Shard) Stop() {
	s.stopOnce.Do(func() {
		if b := s.App.Assembly(); b != nil {
			b.Events.Close()
		}
		s.cancel()
		<-s.done
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
	if _, err := s.Store.Put(context.Background(), s.Keys.Operator(tenant, id), rec, objstore.PutOptions{}); err != nil {
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

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
