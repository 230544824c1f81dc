package app

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/bootstrap"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/health"
	"github.com/nstance-dev/nstance/internal/server/metrics"
	"github.com/nstance-dev/nstance/internal/server/operatorapi"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// DefaultHealthPort is the health port before any offset.
const DefaultHealthPort = 8990

// Cache kinds mirrored from storage.
const (
	KindInstance = "instance"
	KindGroups   = "groups"
)

// BindOverrides replace or shift the bind addresses from the config.
type BindOverrides struct {
	// PortOffset is added to every configured port (the dev stack uses 10*(N-1)).
	PortOffset int
	// Explicit addresses win over config and offset.
	Health, Election, Registration, Operator, Agent string
}

// Options configures an App.
type Options struct {
	ServerID string
	Shard    string
	Store    objstore.Store
	Keys     layout.Keys
	// CacheDir holds db/{shard}.sqlite; empty keeps the cache in memory.
	CacheDir string
	// AdvertiseHosts are added to the server certificate SANs.
	AdvertiseHosts []string
	Bind           BindOverrides
	// Getenv reads the encryption key variables; os.Getenv when nil.
	Getenv func(string) string
	Log    logr.Logger
	// Registry receives the server metrics; a fresh one when nil.
	Registry *prometheus.Registry
	// Services builds the Operator and Agent services once the cluster
	// material is loaded; operatorapi.Core and an unimplemented Agent service
	// when nil.
	Services ServiceFactory
	// StorageBackoff overrides the retry backoff for storage calls.
	StorageBackoff storage.Backoff
	// NonceSweepInterval is how often the shard leader deletes nonce markers
	// older than the longest nonce lifetime (default 10 minutes).
	NonceSweepInterval time.Duration
	// TrustRefresh is how often the cluster CA and CA bundle are re-read
	// to follow a CA rotation (default DefaultTrustRefresh).
	TrustRefresh time.Duration
}

// DefaultTrustRefresh is how often a server re-reads the cluster CA and
// the CA bundle; carotation.RefreshGrace must stay well above it.
const DefaultTrustRefresh = 10 * time.Second

// Runtime is what service factories get to build their services.
type Runtime struct {
	Config     *config.Config
	ConfigETag string
	Store      objstore.Store
	Keys       layout.Keys
	Cache      *cache.Cache
	// CA is the cluster CA loaded at start; WorkloadCA signs what templates
	// ask for.
	CA         *pki.CA
	WorkloadCA *pki.CA
	// Trust is the signing cluster CA and the trusted bundle as they are
	// now (they change during a CA rotation); CA is its signer at start.
	Trust *pki.Trust
	// ServerHosts are the names and addresses in this server's certificate;
	// no template certificate may carry them.
	ServerHosts []string
	NonceKey    ed25519.PrivateKey
	Issuer      *registration.Issuer
	// Revocations is the deny list the mTLS listeners consult (admin
	// revocations, deleted instances).
	Revocations *revocation.Gate
	App         *App
	Log         logr.Logger
	// Fence bounds the leader's work by its shard lease; Store is already
	// fenced, provider calls must be (provider.Fenced).
	Fence provider.Fence
	// Metrics takes the fleet's stores, the provider observer and the
	// reconcile queue metrics.
	Metrics *metrics.Server
}

// Services are the shard-leader gRPC services beyond Registration.
type Services struct {
	Operator nstancev1.OperatorServiceServer
	Agent    nstancev1.AgentServiceServer
	// OnAgentRegistered is told about every registered agent.
	OnAgentRegistered registration.AgentRegistered
	// AgentGate admits agent registrations against the instance records;
	// nil refuses every agent.
	AgentGate *registration.InstanceGate
	// Lead, when set, runs for each shard-leadership term once the gRPC
	// services serve (the reconciler); its context ends with the term.
	Lead func(ctx context.Context) error
}

// ServiceFactory builds Services.
type ServiceFactory func(rt *Runtime) (Services, error)

// Addrs are the bound listen addresses (empty until bound).
type Addrs struct {
	Health, Election, Registration, Operator, Agent string
}

// App is one nstance-server.
type App struct {
	o       Options
	reg     *prometheus.Registry
	ready   health.Readiness
	metrics *metrics.Server
	// revocations is the deny list of client certificates (set in Run
	// before the shard election starts) and revSync its re-read interval.
	revocations *revocation.Gate
	revSync     time.Duration

	mu         sync.Mutex
	addrs      Addrs
	cfg        *config.Config
	cfgETag    string
	cfgMod     time.Time
	clusterEl  *election.Elector
	shardEl    *election.Elector
	cacheDB    *cache.Cache
	grpcActive bool
	// servingSince is when this server began serving gRPC as shard leader
	// in the current term (zero while it does not).
	servingSince time.Time
	// serverCerts and trust are read by the certificate expiry metrics.
	serverCerts *pki.RenewingCert
	trust       *pki.Trust
}

// New checks options and returns an App.
func New(o Options) (*App, error) {
	if o.ServerID == "" {
		return nil, errors.New("server id is required")
	}
	if err := layout.ValidateID("server id", o.ServerID); err != nil {
		return nil, err
	}
	if err := layout.ValidateID("shard", o.Shard); err != nil {
		return nil, err
	}
	if o.Store == nil {
		return nil, errors.New("object store is required")
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.StorageBackoff.Initial <= 0 {
		o.StorageBackoff = storage.DefaultBackoff
	}
	a := &App{o: o, reg: o.Registry}
	a.metrics = metrics.New(a.reg, a.metricsProcess())
	return a, nil
}

// Addrs returns the addresses bound so far.
func (a *App) Addrs() Addrs {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addrs
}

// Ready reports whether /health answers 200.
func (a *App) Ready() bool { return a.ready.Ready() }

// ServingGRPC reports whether the gRPC listeners are up (shard leader).
func (a *App) ServingGRPC() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.grpcActive
}

// Leadership names this server and when its current term of serving as
// shard leader began; since is zero while it does not serve.
func (a *App) Leadership() (serverID string, since time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.o.ServerID, a.servingSince
}

// ConfigVersion reports the etag and modification time of the loaded config.
func (a *App) ConfigVersion() (string, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfgETag, a.cfgMod
}

// Cache returns the open cache (nil before Run opened it).
func (a *App) Cache() *cache.Cache {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cacheDB
}

func (a *App) setAddr(f func(*Addrs)) {
	a.mu.Lock()
	f(&a.addrs)
	a.mu.Unlock()
}

func (a *App) log() logr.Logger { return a.o.Log }

func defaultHealthAddr(offset int) string {
	return net.JoinHostPort("0.0.0.0", strconv.Itoa(DefaultHealthPort+offset))
}

// Run runs the server until ctx ends, then shuts down gracefully.
func (a *App) Run(ctx context.Context) error {
	log := a.log()
	var bg sync.WaitGroup
	defer bg.Wait()

	healthAddr := a.o.Bind.Health
	if healthAddr == "" {
		healthAddr = defaultHealthAddr(a.o.Bind.PortOffset)
	}
	healthLn, err := net.Listen("tcp", healthAddr)
	if err != nil {
		return fmt.Errorf("binding health port %s: %w", healthAddr, err)
	}
	a.setAddr(func(ad *Addrs) { ad.Health = healthLn.Addr().String() })
	stopHealth := serveHTTP(&bg, log, "health", healthLn, health.Handler(&a.ready, a.reg, health.Check{Name: "storage", Func: a.storageAnswers}), nil)
	defer stopHealth()
	log.Info("health port listening", "addr", healthLn.Addr().String())

	cfg, err := a.loadConfig(ctx)
	if err != nil {
		return err
	}
	if cfg.Shard.Bind.HealthAddr != "" && a.o.Bind.Health == "" && cfg.Shard.Bind.HealthAddr != healthAddr {
		log.Info("health port is taken from flags, not from shard.bind.health_addr", "bound", healthAddr, "config", cfg.Shard.Bind.HealthAddr)
	}

	ring, err := secrets.LoadKeyring(keySource(cfg.Cluster.Secrets.EncryptionKey), keySources(cfg.Cluster.Secrets.PreviousKeys), a.o.Getenv)
	if err != nil {
		return fmt.Errorf("loading the encryption key: %w", err)
	}
	warnPrintableKeys(log, ring, cfg.Shard.Infra.Provider)

	cachePath := ""
	if a.o.CacheDir != "" {
		cachePath = filepath.Join(a.o.CacheDir, "db", a.o.Shard+".sqlite")
	}
	db, err := cache.Open(ctx, cachePath)
	if err != nil {
		return err
	}
	defer db.Close()
	a.mu.Lock()
	a.cacheDB = db
	a.mu.Unlock()
	if err := a.syncCache(ctx, db); err != nil {
		return err
	}
	a.ready.SetCacheSynced(true)
	log.Info("ready", "shard", a.o.Shard)

	le := cfg.Cluster.LeaderElection
	// One incarnation per process in both leases: a lease under our id with
	// another incarnation that keeps being renewed means a second server
	// runs with our id, and this one stops (election.ErrDuplicateID).
	incarnation, err := election.NewIncarnation()
	if err != nil {
		return err
	}
	// Leases, nonces and create-only records rely on conditional writes; a
	// store that ignores them would make all of them silently unsafe.
	if err := storage.ProbeConditionalWrites(ctx, a.o.Store, a.o.Keys.Probe(a.o.Shard, a.o.ServerID, incarnation)); err != nil {
		return fmt.Errorf("refusing to run: %w", err)
	}
	log.Info("campaigning", "id", a.o.ServerID, "incarnation", incarnation)
	newElector := func(key string, onLeading func(context.Context, int64)) (*election.Elector, error) {
		return election.New(election.Config{
			Store: a.o.Store, Key: key, ID: a.o.ServerID, Incarnation: incarnation, LeaseDuration: le.LeaseDuration.D(),
			RenewDeadline: le.RenewDeadline.D(), MaxClockSkew: le.MaxClockSkew.D(), RenewInterval: le.RenewInterval.D(), RetryInterval: le.RetryInterval.D(), Log: log.WithName("election"), OnLeading: onLeading,
		})
	}
	clusterEl, err := newElector(a.o.Keys.ClusterLeader(), a.metrics.Leading(metrics.ElectionCluster, nil))
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.clusterEl = clusterEl
	a.mu.Unlock()
	electCtx, stopElections := context.WithCancel(context.WithoutCancel(ctx))
	var electWG sync.WaitGroup
	defer electWG.Wait()
	defer stopElections()
	// runCtx ends with ctx or when an election refuses to go on.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	campaign := func(el *election.Elector) {
		electWG.Add(1)
		go func() {
			defer electWG.Done()
			if err := el.Run(electCtx); err != nil {
				stopRun(err)
			}
		}()
	}
	campaign(clusterEl)

	bootOpts := bootstrap.Options{
		ClusterID: cfg.Cluster.ID, Objects: a.o.Store, Secrets: &secrets.Store{Objects: a.o.Store, Ring: ring}, Keys: a.o.Keys,
		CAValidity: cfg.Certificates.CAValidity.D(), IsLeader: clusterEl.Leading, RetryInterval: le.RetryInterval.D(), Log: log.WithName("bootstrap"),
	}
	cl, err := bootstrap.Ensure(runCtx, bootOpts)
	if err != nil {
		if cause := context.Cause(runCtx); ctx.Err() == nil && cause != nil {
			return cause
		}
		return err
	}
	trust, err := pki.NewTrust(cl.CA, cl.CABundlePEM)
	if err != nil {
		return fmt.Errorf("cluster CA bundle: %w", err)
	}
	certHosts := a.certHosts(cfg)
	// The server certificate is renewed with a third of its validity left
	// and swapped in live for new handshakes; it is re-issued at once when
	// a CA rotation switches the signing CA.
	serverID := pki.ServerIdentity{ClusterID: cfg.Cluster.ID, Shard: a.o.Shard, ServerID: a.o.ServerID}
	serverCerts, err := pki.NewRenewingCert(func(now time.Time) (tls.Certificate, error) {
		return trust.Signer().ServerKeyPair(serverID, certHosts, cfg.Certificates.ServerValidity.D(), now)
	}, 2.0/3, nil, log.WithName("server-cert"))
	if err != nil {
		return fmt.Errorf("issuing the server certificate: %w", err)
	}
	bg.Add(2)
	go func() { defer bg.Done(); serverCerts.Run(runCtx) }()
	trustRefresh := a.o.TrustRefresh
	if trustRefresh <= 0 {
		trustRefresh = DefaultTrustRefresh
	}
	go func() {
		defer bg.Done()
		bootstrap.WatchTrust(runCtx, bootOpts, trust, trustRefresh, serverCerts.RenewNow)
	}()
	serverCert := *serverCerts.Current()
	a.mu.Lock()
	a.serverCerts, a.trust = serverCerts, trust
	a.mu.Unlock()

	bind := cfg.Shard.Bind
	if err := bind.ApplyPortOffset(a.o.Bind.PortOffset); err != nil {
		return err
	}
	override(&bind.ElectionAddr, a.o.Bind.Election)
	override(&bind.RegistrationAddr, a.o.Bind.Registration)
	override(&bind.OperatorAddr, a.o.Bind.Operator)
	override(&bind.AgentAddr, a.o.Bind.Agent)

	electLn, err := net.Listen("tcp", bind.ElectionAddr)
	if err != nil {
		return fmt.Errorf("binding election port %s: %w", bind.ElectionAddr, err)
	}
	a.setAddr(func(ad *Addrs) { ad.Election = electLn.Addr().String() })
	electTLS := pki.ServerTLS(serverCert, nil, false)
	electTLS.Certificates, electTLS.GetCertificate = nil, serverCerts.GetCertificate
	stopElect := serveHTTP(&bg, log, "election", electLn, health.ElectionHandler(a.electionState), electTLS)
	defer stopElect()
	a.newRevocations(cfg, log)

	issuer := &registration.Issuer{
		CA: cl.CA, Trust: trust, ClusterID: cfg.Cluster.ID,
		AgentValidity: cfg.Certificates.AgentValidity.D(), OperatorValidity: cfg.Certificates.OperatorValidity.D(),
	}
	// Everything the shard leader writes goes through the fence: once its
	// lease no longer lets it act, writes, provider calls and RPCs are
	// refused even before its work has noticed.
	fence := leaderFence{a: a}
	leaderStore := a.leaderStore()
	rt := &Runtime{
		Config: withAdvertiseDefaults(cfg, bind), ConfigETag: a.cfgETag, Store: leaderStore, Keys: a.o.Keys, Cache: db,
		CA: cl.CA, Trust: trust, WorkloadCA: cl.WorkloadCA, ServerHosts: certHosts, NonceKey: cl.NonceKey, Issuer: issuer, App: a, Log: log,
		Fence: fence, Metrics: a.metrics,
	}
	rt.Revocations = a.revocations
	factory := a.o.Services
	if factory == nil {
		factory = DefaultServices
	}
	svcs, err := factory(rt)
	if err != nil {
		return fmt.Errorf("building services: %w", err)
	}
	reg := &registration.Service{
		Issuer: issuer,
		Verifier: &nonce.Verifier{Key: cl.NonceKey.Public().(ed25519.PublicKey), ClusterID: cfg.Cluster.ID, Shard: a.o.Shard, Leeway: 5 * time.Second,
			MaxLifetime: cfg.Certificates.NonceMaxLifetime.D()},
		Ledger:  &nonce.Ledger{Store: leaderStore, Keys: a.o.Keys},
		Objects: leaderStore, Keys: a.o.Keys, ServerID: a.o.ServerID,
		OnAgentRegistered: svcs.OnAgentRegistered, Log: log.WithName("registration"),
	}
	// Agents are admitted against the instance records (nil: refused).
	reg.Instances = svcs.AgentGate
	gcfg := grpcserve.Config{
		ClusterID: cfg.Cluster.ID, ServerCert: serverCert, GetCertificate: serverCerts.GetCertificate, ClientCAsFunc: trust.Pool,
		Registration: reg, Operator: svcs.Operator, Agent: svcs.Agent, Log: log.WithName("grpc"), Limits: cfg.Shard.Limits,
		ServerOptions: append(a.metrics.ServerOptions(), fence.grpcOptions()...), OnServer: a.metrics.InitializeGRPC,
		PanicHook: a.o.Getenv(grpcserve.PanicHookEnv) == "1",
		OnHandshakeError: func(listener string, err error) {
			logHandshakeFailure(log.WithName("tls"), listener, a.metrics.HandshakeFailed(listener, err), err)
		},
	}
	if gcfg.PanicHook {
		log.Info("WARNING: the test-only panic hook is on: a call carrying metadata "+grpcserve.PanicHookHeader+" panics", "variable", grpcserve.PanicHookEnv)
	}

	shardEl, err := newElector(a.o.Keys.ShardLeader(a.o.Shard), a.metrics.Leading(metrics.ElectionShard, func(lctx context.Context, term int64) {
		a.leadShard(lctx, ctx, term, db, gcfg, svcs.Lead, &bind, cfg.Shard.Timeouts.Shutdown.D())
	}))
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.shardEl = shardEl
	a.mu.Unlock()
	campaign(shardEl)

	<-runCtx.Done()
	stopElections()
	electWG.Wait()
	if cause := context.Cause(runCtx); ctx.Err() == nil && cause != nil {
		log.Error(cause, "stopping")
		return cause
	}
	log.Info("shutting down")
	return nil
}

// warnPrintableKeys warns loudly, outside development providers, about
// encryption keys that are printable text instead of 32 random bytes.
func warnPrintableKeys(log logr.Logger, ring *secrets.Keyring, provider string) {
	ids := ring.PrintableIDs()
	if len(ids) == 0 {
		return
	}
	if config.IsDevProvider(provider) {
		log.V(1).Info("encryption key is printable text; fine for development", "key_ids", ids)
		return
	}
	log.Error(errors.New("weak encryption key"),
		"!!! WARNING: the encryption key is printable text, not 32 random bytes; it protects the CA keys: "+
			"replace it with `head -c 32 /dev/urandom | base64` (keep the old one in cluster.secrets.previous_keys until secrets are re-sealed)",
		"key_ids", ids, "provider", provider)
}

// withAdvertiseDefaults fills the advertised gRPC addresses the config
// leaves empty from the first advertised host and the port actually bound
// (after --port-offset and --bind-* flags), so agents and operators are told
// a reachable address without the config repeating every port.
func withAdvertiseDefaults(cfg *config.Config, bind config.Bind) *config.Config {
	adv := cfg.Shard.Advertise
	if len(adv.Hosts) == 0 {
		return cfg
	}
	fill := func(dst *string, bindAddr string) {
		if *dst != "" {
			return
		}
		if _, port, err := net.SplitHostPort(bindAddr); err == nil && port != "" && port != "0" {
			*dst = net.JoinHostPort(adv.Hosts[0], port)
		}
	}
	fill(&adv.RegistrationAddr, bind.RegistrationAddr)
	fill(&adv.AgentAddr, bind.AgentAddr)
	fill(&adv.OperatorAddr, bind.OperatorAddr)
	c := *cfg
	c.Shard.Advertise = adv
	return &c
}

func override(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

func keySource(k config.KeySource) secrets.Source {
	return secrets.Source{Provider: k.Provider, Env: k.Env, File: k.File}
}

func keySources(ks []config.KeySource) []secrets.Source {
	var out []secrets.Source
	for _, k := range ks {
		out = append(out, keySource(k))
	}
	return out
}

// DefaultServices serves the core Operator RPCs and an Agent service whose
// RPCs answer Unimplemented.
func DefaultServices(rt *Runtime) (Services, error) {
	return Services{
		Operator: &operatorapi.Core{Shard: rt.Config.Shard.ID, Config: rt.App, Issuer: rt.Issuer,
			Operators: &operatorapi.OperatorRecords{Store: rt.Store, Keys: rt.Keys}, Log: rt.Log.WithName("operator")},
		Agent: &nstancev1.UnimplementedAgentServiceServer{},
	}, nil
}

// certHosts are the SANs of the server certificate: what the config knows
// (loopback, advertised hosts, specific bind hosts), the --advertise-host
// flags and the host name.
func (a *App) certHosts(cfg *config.Config) []string {
	hosts := cfg.ServerHosts()
	hosts = append(hosts, a.o.AdvertiseHosts...)
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	return slices.Compact(hosts)
}

// loadConfig reads and validates config/{shard}.jsonc, retrying with backoff
// on storage errors and on invalid documents (an operator may fix them).
func (a *App) loadConfig(ctx context.Context) (*config.Config, error) {
	var cfg *config.Config
	key := a.o.Keys.Config(a.o.Shard)
	err := storage.Retry(ctx, a.log(), "loading "+key, a.o.StorageBackoff, func(ctx context.Context) error {
		obj, err := a.o.Store.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("reading %s: %w", key, err)
		}
		c, err := config.Parse(obj.Body)
		if err != nil {
			return fmt.Errorf("%s is invalid: %w", key, err)
		}
		if c.Shard.ID != a.o.Shard {
			return fmt.Errorf("%s: shard.id: is %q, but this server runs shard %q", key, c.Shard.ID, a.o.Shard)
		}
		cfg = c
		a.mu.Lock()
		a.cfg, a.cfgETag, a.cfgMod = c, obj.ETag, obj.LastModified
		a.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	a.ready.SetConfigLoaded(true)
	a.log().Info("config loaded", "key", key)
	return cfg, nil
}

func (a *App) cacheSources() []cache.Source {
	return []cache.Source{
		{Kind: KindInstance, Prefix: a.o.Keys.InstancePrefix(a.o.Shard)},
		{Kind: KindGroups, Key: a.o.Keys.Groups(a.o.Shard)},
	}
}

func (a *App) syncCache(ctx context.Context, db *cache.Cache) error {
	return storage.Retry(ctx, a.log(), "syncing the cache", a.o.StorageBackoff, func(ctx context.Context) error {
		return db.Rebuild(ctx, a.o.Store, a.cacheSources(), time.Now())
	})
}

// leadShard runs while this server holds the shard lease.
func (a *App) leadShard(lctx, appCtx context.Context, term int64, db *cache.Cache, gcfg grpcserve.Config, lead func(context.Context) error, bind *config.Bind, shutdown time.Duration) {
	log := a.log().WithValues("term", term)
	if err := a.syncCache(lctx, db); err != nil {
		log.Error(err, "rebuilding the cache on leadership; stepping down")
		return
	}
	if err := a.loadRevocations(lctx); err != nil {
		log.Error(err, "loading revocations on leadership; stepping down")
		return
	}
	gcfg.Gate = a.revocations
	ls, err := a.listenGRPC(bind)
	if err != nil {
		log.Error(err, "binding gRPC listeners; stepping down")
		return
	}
	srv, err := grpcserve.Start(gcfg, ls)
	if err != nil {
		log.Error(err, "starting gRPC servers; stepping down")
		return
	}
	a.mu.Lock()
	a.grpcActive, a.servingSince = true, time.Now()
	a.mu.Unlock()
	ad := a.Addrs()
	log.Info("serving gRPC as shard leader", "registration", ad.Registration, "operator", ad.Operator, "agent", ad.Agent)
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		a.sweepNonces(lctx, log)
	}()
	defer func() { <-sweepDone }()
	leadDone := make(chan struct{})
	go func() {
		defer close(leadDone)
		if lead == nil {
			return
		}
		// The term's work (loading state, reconciling) is retried until the
		// term ends: a storage hiccup must not leave a leader that serves
		// gRPC but never converges.
		for {
			err := lead(lctx)
			if lctx.Err() != nil {
				return
			}
			log.Error(err, "shard leadership work stopped; restarting it")
			select {
			case <-lctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
	<-lctx.Done()
	// Stop serving before waiting for the term's work: the elector cancels
	// lctx when this server may no longer act, and a standby may take over
	// soon after.
	a.mu.Lock()
	a.grpcActive, a.servingSince = false, time.Time{}
	a.mu.Unlock()
	if appCtx.Err() != nil {
		// Shutting down while still leading: let RPCs finish, but never
		// beyond the time this server may act.
		grace := shutdown
		if st := (leaderFence{a: a}).elector().Status(); st.Leading {
			grace = min(grace, time.Until(st.ValidUntil))
		} else {
			grace = 0
		}
		srv.GracefulStop(max(grace, 0))
	} else {
		// Leadership lost: another server may already serve; stop at once.
		srv.Stop()
	}
	<-leadDone
	log.Info("stopped serving gRPC")
}

// newRevocations builds the deny list the mTLS listeners consult.
func (a *App) newRevocations(cfg *config.Config, log logr.Logger) {
	a.revocations = revocation.New(revocation.Options{
		Store: a.leaderStore(), Keys: a.o.Keys, ClusterID: cfg.Cluster.ID, Shard: a.o.Shard, ServerID: a.o.ServerID,
		OperatorValidity: cfg.Certificates.OperatorValidity.D(), AgentValidity: cfg.Certificates.AgentValidity.D(),
		RequireOperatorRecords: true, Log: log.WithName("revocation"),
	})
	a.revSync = cfg.Certificates.RevocationSyncInterval.D()
}

// loadRevocations reads the deny list before the term serves anything and
// keeps re-reading it for the length of the term (lctx).
func (a *App) loadRevocations(lctx context.Context) error {
	if a.revocations == nil {
		return nil
	}
	err := storage.Retry(lctx, a.log(), "loading revocations", a.o.StorageBackoff, a.revocations.Sync)
	if err != nil {
		return err
	}
	go a.revocations.Run(lctx, a.revSync)
	return nil
}

// Nonce marker housekeeping. A marker is needed while its nonce could still
// verify: a nonce verified at time t expires at most MaxLifetime + leeway
// later, and a replay is refused as expired after another leeway; the skew
// allowance covers the storage clock that stamped the marker.
const (
	nonceLeeway        = 5 * time.Second // the Registration verifier's leeway
	nonceSkewAllowance = 5 * time.Minute
	// nonceSweepLimit bounds the deletions of one pass, so a backlog is
	// worked off over several passes instead of one long burst.
	nonceSweepLimit = 2000
)

// sweepNonces deletes old nonce markers for the length of a shard
// leadership term: the shard's agent-nonce markers, and, while this server
// also leads the cluster, the cluster-wide operator-nonce markers. The first
// pass waits one interval, so a takeover never waits for it.
func (a *App) sweepNonces(ctx context.Context, log logr.Logger) {
	every := a.o.NonceSweepInterval
	if every <= 0 {
		every = 10 * time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		cfg, ce := a.cfg, a.clusterEl
		a.mu.Unlock()
		maxLife := nonce.DefaultMaxLifetime
		if cfg != nil && cfg.Certificates.NonceMaxLifetime > 0 {
			maxLife = cfg.Certificates.NonceMaxLifetime.D()
		}
		cutoff := time.Now().Add(-(maxLife + 2*nonceLeeway + nonceSkewAllowance))
		ledger := &nonce.Ledger{Store: a.leaderStore(), Keys: a.o.Keys}
		prefixes := []string{a.o.Keys.ShardNonce(a.o.Shard, "")}
		if ce != nil && ce.Leading() {
			prefixes = append(prefixes, a.o.Keys.ClusterNonce(""))
		}
		for _, p := range prefixes {
			st, err := ledger.Sweep(ctx, p, cutoff, nonceSweepLimit)
			if err != nil && ctx.Err() == nil {
				log.Error(err, "sweeping nonce markers", "prefix", p)
			}
			if st.Deleted > 0 || st.More {
				log.V(1).Info("swept nonce markers", "prefix", p, "listed", st.Listed, "deleted", st.Deleted, "more", st.More)
			}
		}
	}
}

// listenGRPC binds the three gRPC listeners. A port chosen by the kernel
// (":0") is remembered so later terms bind the same address again.
func (a *App) listenGRPC(bind *config.Bind) (grpcserve.Listeners, error) {
	prev := a.Addrs()
	var ls grpcserve.Listeners
	var opened []net.Listener
	fail := func(err error) (grpcserve.Listeners, error) {
		for _, l := range opened {
			_ = l.Close()
		}
		return grpcserve.Listeners{}, err
	}
	for _, it := range []struct {
		name string
		addr string
		prev string
		dst  *net.Listener
		set  func(*Addrs, string)
	}{
		{"registration", bind.RegistrationAddr, prev.Registration, &ls.Registration, func(ad *Addrs, s string) { ad.Registration = s }},
		{"operator", bind.OperatorAddr, prev.Operator, &ls.Operator, func(ad *Addrs, s string) { ad.Operator = s }},
		{"agent", bind.AgentAddr, prev.Agent, &ls.Agent, func(ad *Addrs, s string) { ad.Agent = s }},
	} {
		addr := it.addr
		if it.prev != "" {
			addr = it.prev
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fail(fmt.Errorf("binding %s port %s: %w", it.name, addr, err))
		}
		opened = append(opened, l)
		*it.dst = l
		a.setAddr(func(ad *Addrs) { it.set(ad, l.Addr().String()) })
	}
	return ls, nil
}

// storageAnswers is the readiness check of storage: the shard election has
// had an answer from storage within one lease duration. Without one this
// server can neither lead nor take over.
func (a *App) storageAnswers() error {
	a.mu.Lock()
	el, cfg := a.shardEl, a.cfg
	a.mu.Unlock()
	if el == nil || cfg == nil {
		return errors.New("shard election not started")
	}
	limit := cfg.Cluster.LeaderElection.LeaseDuration.D()
	last := el.Status().LastContact
	if last.IsZero() {
		return errors.New("storage has not answered yet")
	}
	if age := time.Since(last); age > limit {
		return fmt.Errorf("storage last answered %s ago (more than the lease duration %s)", age.Round(time.Second), limit)
	}
	return nil
}

func (a *App) electionState() health.ElectionState {
	a.mu.Lock()
	ce, se, cfg := a.clusterEl, a.shardEl, a.cfg
	a.mu.Unlock()
	s := health.ElectionState{ServerID: a.o.ServerID, Shard: a.o.Shard}
	if cfg != nil {
		s.ClusterID = cfg.Cluster.ID
	}
	if ce != nil {
		st := ce.Status()
		s.ClusterLeader, s.ClusterLeaderHolder = st.Leading, st.Holder
	}
	if se != nil {
		st := se.Status()
		s.ShardLeader, s.ShardLeaderHolder, s.ShardTerm = st.Leading, st.Holder, st.Term
	}
	return s
}

// serveHTTP serves h on ln (over TLS when tlsCfg is set) and returns a
// function that shuts the server down.
func serveHTTP(wg *sync.WaitGroup, log logr.Logger, name string, ln net.Listener, h http.Handler, tlsCfg *tls.Config) func() {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	if tlsCfg != nil {
		tlsCfg = tlsCfg.Clone()
		tlsCfg.NextProtos = []string{"h2", "http/1.1"}
		ln = tls.NewListener(ln, tlsCfg)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "http server stopped", "server", name)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
	}
}
