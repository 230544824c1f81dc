package app

import (
	"context"
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
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/carotation"
	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/secrets/awssecrets"
	"github.com/nstance-dev/nstance/internal/secrets/gcpsecrets"
	"github.com/nstance-dev/nstance/internal/server/bootstrap"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/health"
	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/metrics"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/workloadca"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// DefaultHealthPort is the health port before any offset.
const DefaultHealthPort = 8990

// Cache kinds mirrored from storage.
const (
	KindInstance = cache.KindInstance
	KindGroups   = cache.KindGroups
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
	// AdvertiseHosts are added to the server certificate SANs; the first
	// one is advertised when shard.advertise.hosts is empty.
	AdvertiseHosts []string
	// LeaderInterfaceID, when set, makes the shard leader hold this ENI
	// (shard.leader_address mode aws-eni), whatever the config says: the
	// shard's Auto Scaling group hands it to its servers in user data.
	LeaderInterfaceID string
	// LeaderPod, "namespace/name", makes the shard leader label its own
	// pod nstance.dev/shard-leader=true (leaderaddr.PodLabel), whatever
	// the config says: the nstance-server chart's Service selects it.
	LeaderPod string
	// LeaderAddress, when set, replaces the holder shard.leader_address
	// and the flags above would build (tests: a cloud holder on a fake).
	LeaderAddress leaderaddr.Holder
	Bind          BindOverrides
	// Getenv reads the encryption key variables; os.Getenv when nil.
	Getenv func(string) string
	// Remote reads AWS Secrets Manager and SSM values (encryption keys and
	// secret files); the SDK's default clients when nil.
	Remote secrets.Remote
	Log    logr.Logger
	// Registry receives the server metrics; a fresh one when nil.
	Registry *prometheus.Registry
	// MetricsTokenFile holds the bearer token a /metrics scrape presents to
	// see tenant and group labels; without it every scrape gets the
	// aggregated series (health.Metrics).
	MetricsTokenFile string
	// Provider replaces the provider shard.infra.provider names (tests pass
	// one they inspect); otherwise Providers (default DefaultProviders)
	// builds it, with Local's overrides for the development kinds, and
	// checks every loaded config's shard.infra.
	Provider  provider.Provider
	Providers *provider.Registry
	Local     provider.Local
	// LoadBalancers are the load balancer kinds the config's
	// load_balancers entries choose from (default DefaultLoadBalancers);
	// its check runs on every loaded config.
	LoadBalancers *loadbalancer.Registry
	// ConfigChecks run on the loaded config besides its own validation and
	// the registry's check; a document they reject is retried like any
	// invalid one.
	ConfigChecks []config.Check
	// Tuning adjusts the reconciler and the Agent service (tests).
	Tuning Tuning
	// OperatorRecordsOptional admits operator and admin certificates
	// without a record in cluster/operators/ (tests that dial with
	// certificates issued straight from the CA); nstance-server always
	// requires the record.
	OperatorRecordsOptional bool
	// StorageBackoff overrides the retry backoff for storage calls.
	StorageBackoff storage.Backoff
	// NonceSweepInterval is how often the shard leader deletes nonce markers
	// older than the longest nonce lifetime (default 10 minutes).
	NonceSweepInterval time.Duration
	// TrustRefresh is how often the cluster CA and CA bundle are re-read
	// to follow a CA rotation (default DefaultTrustRefresh).
	TrustRefresh time.Duration
	// CacheRefresh is how often a standby brings its cache up to date with
	// storage (default 30s), so a takeover reads few records.
	CacheRefresh time.Duration
}

// DefaultTrustRefresh is how often a server re-reads the cluster CA and
// the CA bundle; carotation.RefreshGrace must stay well above it.
const DefaultTrustRefresh = 10 * time.Second

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

	mu        sync.Mutex
	addrs     Addrs
	cfg       *config.Config
	cfgETag   string
	cfgMod    time.Time
	clusterEl *election.Elector
	shardEl   *election.Elector
	cacheDB   *cache.Cache
	built     *Assembly
	// servingSince is when this server began serving gRPC as shard leader
	// in the current term (zero while it does not: ServingGRPC).
	servingSince time.Time
	// term is the running leadership term (nil while standing by).
	term *leaderTerm

	// standby refreshes the cache from storage while this server does not
	// lead (while it leads, the term's record store writes the cache).
	standby *standbyJob
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
	if o.Providers == nil {
		o.Providers = DefaultProviders()
	}
	if o.LoadBalancers == nil {
		o.LoadBalancers = DefaultLoadBalancers()
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
	return !a.servingSince.IsZero()
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

// Assembly returns the services and reconciler Run built (nil before the
// cluster material was loaded).
func (a *App) Assembly() *Assembly {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.built
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
	stopHealth := serveHTTP(&bg, log, "health", healthLn, health.Handler(&a.ready, health.Metrics{Full: a.reg, Public: metrics.Public(a.reg), TokenFile: a.o.MetricsTokenFile}, health.Check{Name: "storage", Func: a.storageAnswers}), nil)
	defer stopHealth()
	log.Info("health port listening", "addr", healthLn.Addr().String())

	cfg, err := a.loadConfig(ctx)
	if err != nil {
		return err
	}
	if cfg.Shard.Bind.HealthAddr != "" && a.o.Bind.Health == "" && cfg.Shard.Bind.HealthAddr != healthAddr {
		log.Info("health port is taken from flags, not from shard.bind.health_addr", "bound", healthAddr, "config", cfg.Shard.Bind.HealthAddr)
	}

	ring, remote, err := a.loadKeyring(ctx, cfg)
	if err != nil {
		return err
	}
	db, err := a.openCache(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	log.Info("ready", "shard", a.o.Shard)

	le := cfg.Cluster.LeaderElection
	newElector, err := a.electors(ctx, le)
	if err != nil {
		return err
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
	a.standby = &standbyJob{parent: runCtx, job: func(ctx context.Context) { a.refreshCache(ctx, db) }}
	a.standby.start()
	defer a.standby.close() // before db.Close

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
	bg.Add(1)
	go func() { defer bg.Done(); a.syncRevocations(runCtx) }()

	issuer := &registration.Issuer{
		CA: cl.CA, Trust: trust, ClusterID: cfg.Cluster.ID,
		AgentValidity: cfg.Certificates.AgentValidity.D(), OperatorValidity: cfg.Certificates.OperatorValidity.D(),
	}
	// Everything the shard leader writes goes through the fence: once its
	// lease no longer lets it act, writes, provider calls and RPCs are
	// refused even before its work has noticed.
	fence := leaderFence{a: a}
	_, cfgMod := a.ConfigVersion()
	// Every service and the shard leader's work, built once (assemble.go).
	built, err := Assemble(Parts{
		Config: withAdvertiseDefaults(cfg, bind, a.o.AdvertiseHosts), ConfigETag: a.cfgETag, ConfigModified: cfgMod,
		Store: a.leaderStore(), Keys: a.o.Keys, ServerID: a.o.ServerID,
		Provider: a.o.Provider, Providers: a.o.Providers, LoadBalancers: a.o.LoadBalancers, Local: a.o.Local, Fence: fence, Cache: db,
		Trust: trust, Issuer: issuer, NonceKey: cl.NonceKey, WorkloadCAs: a.workloadCAs(cfg, bootOpts.Secrets, log), ServerHosts: certHosts,
		Revocations: a.revocations, Leadership: a.Leadership, Metrics: a.metrics, Tuning: a.o.Tuning, Log: log,
		Ring: ring, Remote: remote,
	})
	if err != nil {
		return fmt.Errorf("assembling the server: %w", err)
	}
	a.mu.Lock()
	a.built = built
	a.mu.Unlock()
	gcfg := a.grpcConfig(cfg, serverCerts, trust, built)

	// A standby never holds the leader address: one left behind by a run
	// killed while leading is removed before campaigning.
	leaderAddr, err := a.newLeaderAddress(cfg.Shard.LeaderAddress, cfg.Shard.Infra)
	if err != nil {
		return err
	}
	releaseLeaderAddress(leaderAddr, log)
	lead := &leading{grpc: gcfg, built: built, bind: &bind, shutdown: cfg.Shard.Timeouts.Shutdown.D(), addr: leaderAddr}
	shardEl, err := newElector(a.o.Keys.ShardLeader(a.o.Shard), a.metrics.Leading(metrics.ElectionShard, func(lctx context.Context, term int64) {
		a.leadShard(lctx, ctx, term, lead)
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

// grpcConfig is the configuration of every term's gRPC servers but the
// per-term Agent service and the revocation gate (term.go): the renewing
// server certificate, the cluster's trusted CAs, the process's services,
// metrics and the fence that refuses RPCs once the lease no longer lets
// this server act.
func (a *App) grpcConfig(cfg *config.Config, serverCerts *pki.RenewingCert, trust *pki.Trust, built *Assembly) grpcserve.Config {
	gcfg := grpcserve.Config{
		ClusterID: cfg.Cluster.ID, ServerCert: *serverCerts.Current(), GetCertificate: serverCerts.GetCertificate, ClientCAsFunc: trust.Pool,
		Registration: built.Registration, Operator: built.Operator, Log: a.log().WithName("grpc"), Limits: cfg.Shard.Limits,
		ServerOptions: append(a.metrics.ServerOptions(), leaderFence{a: a}.grpcOptions()...), OnServer: a.metrics.InitializeGRPC,
		PanicHook: a.o.Getenv(grpcserve.PanicHookEnv) == "1",
		OnHandshakeError: func(listener string, err error) {
			logHandshakeFailure(a.log().WithName("tls"), listener, a.metrics.HandshakeFailed(listener, err), err)
		},
	}
	if gcfg.PanicHook {
		a.log().Info("WARNING: the test-only panic hook is on: a call carrying metadata "+grpcserve.PanicHookHeader+" panics", "variable", grpcserve.PanicHookEnv)
	}
	return gcfg
}

// electors probes the store for conditional writes and returns how this
// process builds its electors. One incarnation per process serves both
// leases: a lease under our id with another incarnation that keeps being
// renewed means a second server runs with our id, and this one stops
// (election.ErrDuplicateID).
func (a *App) electors(ctx context.Context, le config.LeaderElection) (func(key string, onLeading func(context.Context, int64)) (*election.Elector, error), error) {
	incarnation, err := election.NewIncarnation()
	if err != nil {
		return nil, err
	}
	// Leases, nonces and create-only records rely on conditional writes; a
	// store that ignores them would make all of them silently unsafe.
	if err := storage.ProbeConditionalWrites(ctx, a.o.Store, a.o.Keys.Probe(a.o.Shard, a.o.ServerID, incarnation)); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err() // stopped during the probe: not a verdict on the store
		}
		return nil, fmt.Errorf("refusing to run: %w", err)
	}
	a.log().Info("campaigning", "id", a.o.ServerID, "incarnation", incarnation)
	return func(key string, onLeading func(context.Context, int64)) (*election.Elector, error) {
		return election.New(election.Config{
			Store: a.o.Store, Key: key, ID: a.o.ServerID, Incarnation: incarnation, LeaseDuration: le.LeaseDuration.D(),
			RenewDeadline: le.RenewDeadline.D(), MaxClockSkew: le.MaxClockSkew.D(), RenewInterval: le.RenewInterval.D(),
			RetryInterval: le.RetryInterval.D(), Log: a.log().WithName("election"), OnLeading: onLeading,
		})
	}, nil
}

// loadKeyring loads the encryption key and the previous keys. Keys from AWS
// Secrets Manager or SSM use the SDK's default credentials and region, keys
// from Google Secret Manager Application Default Credentials; clients are
// built only when a key names them.
func (a *App) loadKeyring(ctx context.Context, cfg *config.Config) (*secrets.Keyring, secrets.Remote, error) {
	keyCtx, cancel := context.WithTimeout(ctx, keyLoadTimeout)
	defer cancel()
	remote := a.o.Remote
	if remote == nil {
		aws := awssecrets.New(awssecrets.DefaultClients())
		remote = secrets.ByProvider{
			secrets.ProviderAWSSecretsManager: aws, secrets.ProviderAWSSSM: aws,
			secrets.ProviderGCPSecretManager: gcpsecrets.New(gcpsecrets.DefaultClient()),
		}
	}
	ring, err := secrets.Loader{Getenv: a.o.Getenv, Remote: remote}.Keyring(keyCtx,
		keySource(cfg.Cluster.Secrets.EncryptionKey), keySources(cfg.Cluster.Secrets.PreviousKeys))
	if err != nil {
		return nil, nil, fmt.Errorf("loading the encryption key: %w", err)
	}
	warnPrintableKeys(a.log(), ring, cfg.Shard.Infra.Provider)
	return ring, remote, nil
}

// openCache opens the SQLite cache (db/{shard}.sqlite under CacheDir, in
// memory without one) and brings it up to date with storage before the
// server reports ready; the caller closes it.
func (a *App) openCache(ctx context.Context) (*cache.Cache, error) {
	path := ""
	if a.o.CacheDir != "" {
		path = filepath.Join(a.o.CacheDir, "db", a.o.Shard+".sqlite")
	}
	db, err := cache.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.cacheDB = db
	a.mu.Unlock()
	if err := a.syncCache(ctx, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	a.ready.SetCacheSynced(true)
	return db, nil
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
// leaves empty from the first advertised host (shard.advertise.hosts, else
// the --advertise-host flags) and the port actually bound (after
// --port-offset and --bind-* flags), so agents and operators are told a
// reachable address without the config repeating every port.
func withAdvertiseDefaults(cfg *config.Config, bind config.Bind, flagHosts []string) *config.Config {
	adv := cfg.Shard.Advertise
	hosts := adv.Hosts
	if len(hosts) == 0 {
		hosts = flagHosts
	}
	if len(hosts) == 0 {
		return cfg
	}
	fill := func(dst *string, bindAddr string) {
		if *dst != "" {
			return
		}
		if _, port, err := net.SplitHostPort(bindAddr); err == nil && port != "" && port != "0" {
			*dst = net.JoinHostPort(hosts[0], port)
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

// keyLoadTimeout bounds reading the encryption keys (AWS calls retry).
const keyLoadTimeout = time.Minute

func keySource(k config.KeySource) secrets.Source {
	return secrets.Source{Provider: k.Provider, Env: k.Env, File: k.File, SecretID: k.SecretID, VersionStage: k.VersionStage,
		VersionID: k.VersionID, Parameter: k.Parameter, Region: k.Region}
}

func keySources(ks []config.KeySource) []secrets.Source {
	var out []secrets.Source
	for _, k := range ks {
		out = append(out, keySource(k))
	}
	return out
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
		checks := append([]config.Check{a.o.LoadBalancers.Check}, a.o.ConfigChecks...)
		if a.o.Provider == nil {
			// The registry builds the provider, so it judges shard.infra.
			checks = append([]config.Check{a.o.Providers.Check}, checks...)
		}
		c, err := config.Parse(obj.Body, checks...)
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
		{Kind: cache.KindTenantGroups, Prefix: a.o.Keys.TenantGroupsPrefix(a.o.Shard)},
	}
}

func (a *App) syncCache(ctx context.Context, db *cache.Cache) error {
	return storage.Retry(ctx, a.log(), "syncing the cache", a.o.StorageBackoff, func(ctx context.Context) error {
		st, err := db.Rebuild(ctx, a.o.Store, a.cacheSources(), time.Now())
		if err == nil {
			a.log().V(1).Info("cache synced", "listed", st.Listed, "read", st.Fetched, "removed", st.Removed)
		}
		return err
	})
}

// refreshCache brings a standby's cache up to date with storage every
// Options.CacheRefresh (incremental: one listing, reads of changed objects
// only) until ctx ends: it runs as the standby job, stopped while this
// server leads (the term's record store writes the cache then).
func (a *App) refreshCache(ctx context.Context, db *cache.Cache) {
	every := a.o.CacheRefresh
	if every <= 0 {
		every = 30 * time.Second
	}
	_ = wait.PollUntilContextCancel(ctx, every, false, func(ctx context.Context) (bool, error) {
		if st, err := db.Rebuild(ctx, a.o.Store, a.cacheSources(), time.Now()); err != nil {
			if ctx.Err() == nil {
				a.log().Error(err, "refreshing the cache")
			}
		} else if st.Fetched > 0 || st.Removed > 0 {
			a.log().V(1).Info("cache refreshed", "listed", st.Listed, "read", st.Fetched, "removed", st.Removed)
		}
		return false, nil // every interval until the server leads or stops
	})
}

// newRevocations builds the deny list the mTLS listeners consult.
func (a *App) newRevocations(cfg *config.Config, log logr.Logger) {
	a.revocations = revocation.New(revocation.Options{
		Store: a.leaderStore(), Keys: a.o.Keys, ClusterID: cfg.Cluster.ID, Shard: a.o.Shard, ServerID: a.o.ServerID,
		OperatorValidity: cfg.Certificates.OperatorValidity.D(), AgentValidity: cfg.Certificates.AgentValidity.D(),
		RequireOperatorRecords: !a.o.OperatorRecordsOptional, Log: log.WithName("revocation"),
		// A standby keeps the list loaded without writing (see syncRevocations).
		Standby: func() bool {
			a.mu.Lock()
			se := a.shardEl
			a.mu.Unlock()
			return se == nil || !se.Leading()
		},
	})
	a.revSync = cfg.Certificates.RevocationSyncInterval.D()
}

// syncRevocations keeps the deny list loaded for the life of the process,
// re-read every revSync, on a standby too: the list grows with history
// (every deleted instance leaves an entry for an agent certificate
// lifetime), and a takeover must not wait for reading all of it.
func (a *App) syncRevocations(ctx context.Context) {
	if err := a.revocations.Sync(ctx); err != nil && ctx.Err() == nil {
		a.log().Error(err, "loading revocations")
	}
	a.revocations.Run(ctx, a.revSync)
}

// loadRevocations makes sure the deny list is current before the term
// serves anything: a list whose last sync started within two sync intervals
// (a standby's) is as current as a leader's own (re-read every interval,
// each read taking its time) and is re-read at once in the background, for
// what the previous leader revoked in its last seconds; otherwise it is read
// now.
func (a *App) loadRevocations(lctx context.Context) error {
	if a.revocations == nil {
		return nil
	}
	if at := a.revocations.SyncedAt(); !at.IsZero() && time.Since(at) <= 2*a.revSync {
		go func() {
			if err := a.revocations.Sync(lctx); err != nil && lctx.Err() == nil {
				a.log().Error(err, "re-reading revocations on leadership")
			}
		}()
		return nil
	}
	return storage.Retry(lctx, a.log(), "loading revocations", a.o.StorageBackoff, a.revocations.Sync)
}

// Nonce marker housekeeping. A marker is needed until its nonce has
// expired: its own exp (recorded in the marker), never this shard's
// nonce_max_lifetime, since another shard may accept longer nonces. A
// replay is refused as expired after the verifiers' leeway; the skew
// allowance covers the clocks of other servers and of storage.
const (
	nonceLeeway        = registration.NonceLeeway
	nonceSkewAllowance = 5 * time.Minute
	// nonceSweepLimit bounds the deletions of one pass, so a backlog is
	// worked off over several passes instead of one long burst.
	nonceSweepLimit = 2000
)

// sweepNonces deletes expired nonce markers for the length of a shard
// leadership term: the shard's agent-nonce markers, and, while this server
// also leads the cluster, the cluster-wide operator-nonce markers. Each
// marker goes once its own expiry has passed; markers of older versions
// without one are kept for config.MaxNonceMaxLifetime after their write.
// The first pass waits one interval, so a takeover never waits for it.
func (a *App) sweepNonces(ctx context.Context, log logr.Logger) {
	every := a.o.NonceSweepInterval
	if every <= 0 {
		every = 10 * time.Minute
	}
	sw := &nonce.Sweeper{Store: a.leaderStore(), Grace: 2*nonceLeeway + nonceSkewAllowance, LegacyKeep: config.MaxNonceMaxLifetime,
		Log: func(key string, err error) { log.Error(err, "nonce marker without a readable expiry", "key", key) }}
	_ = wait.PollUntilContextCancel(ctx, every, false, func(ctx context.Context) (bool, error) {
		a.mu.Lock()
		ce := a.clusterEl
		a.mu.Unlock()
		prefixes := []string{a.o.Keys.ShardNonce(a.o.Shard, "")}
		if ce != nil && ce.Leading() {
			prefixes = append(prefixes, a.o.Keys.ClusterNonce(""))
		}
		for _, p := range prefixes {
			st, err := sw.Sweep(ctx, p, time.Now(), nonceSweepLimit)
			if err != nil && ctx.Err() == nil {
				log.Error(err, "sweeping nonce markers", "prefix", p)
			}
			if st.Deleted > 0 || st.More {
				log.V(1).Info("swept nonce markers", "prefix", p, "listed", st.Listed, "deleted", st.Deleted, "kept", st.Kept, "more", st.More)
			}
		}
		return false, nil // every interval until ctx ends
	})
}

// listenGRPC binds the three gRPC listeners. A port chosen by the kernel
// (":0") is remembered so later terms bind the same address again, or a
// new one when another socket has taken it since.
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
		if err != nil && addr != it.addr && isPortZero(it.addr) {
			// The kernel's port of an earlier term is someone else's now;
			// the config asked for any port, so take a new one.
			l, err = net.Listen("tcp", it.addr)
		}
		if err != nil {
			return fail(fmt.Errorf("binding %s port %s: %w", it.name, addr, err))
		}
		opened = append(opened, l)
		*it.dst = l
		a.setAddr(func(ad *Addrs) { it.set(ad, l.Addr().String()) })
	}
	return ls, nil
}

// isPortZero reports whether addr asks the kernel to choose the port.
func isPortZero(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && (port == "0" || port == "")
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

// workloadCAs is the per-tenant workload CA store of this server: a
// tenant's CA is created the first time the shard leader's Agent service
// needs it. The shared workload CA of an older cluster stays in the
// tenants' bundles for the longest workload certificate validity of any
// shard (read from every shard config) plus carotation.RefreshGrace.
func (a *App) workloadCAs(cfg *config.Config, sec *secrets.Store, log logr.Logger) *workloadca.Store {
	return &workloadca.Store{
		Objects: a.o.Store, Secrets: sec, Keys: a.o.Keys, ClusterID: cfg.Cluster.ID, Validity: cfg.Certificates.CAValidity.D(),
		TransitionGrace: func(ctx context.Context) (time.Duration, error) {
			l, err := carotation.LimitsFromConfigs(ctx, a.o.Store, a.o.Keys)
			if err != nil {
				return max(cfg.Certificates.AgentValidity.D(), cfg.Certificates.OperatorValidity.D()) + carotation.RefreshGrace, err
			}
			return l.ClientValidity + carotation.RefreshGrace, nil
		},
		Log: log.WithName("workload-ca"),
	}
}
