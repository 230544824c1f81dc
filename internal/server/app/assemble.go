package app

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/importedca"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/events"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/imagelookup"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/metrics"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	"github.com/nstance-dev/nstance/internal/server/userdata"
	"github.com/nstance-dev/nstance/internal/workloadca"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Parts is what Assemble builds a shard server from: the loaded config and
// the cluster material bootstrap produced. Run fills it in; tests and
// benchmarks that want the services without elections fill in what they
// need (a nil Issuer, WorkloadCA or NonceKey leaves out what needs it).
type Parts struct {
	// Config is the shard config as loaded, with its version.
	Config         *config.Config
	ConfigETag     string
	ConfigModified time.Time
	// Store is the shard leader's (fenced) store.
	Store objstore.Store
	Keys  layout.Keys
	// ServerID names this server in nonce markers and operator records.
	ServerID string
	// Provider replaces the provider shard.infra.provider names (tests).
	Provider provider.Provider
	// Providers are the provider kinds this binary ships; shard.infra.provider
	// picks one (required unless Provider is set). Its check also runs on
	// every refreshed config.
	Providers *provider.Registry
	// Local are the command line's overrides of the development providers.
	Local provider.Local
	// LoadBalancers are the load balancer kinds of the config's
	// load_balancers entries (nil: the entries are refused); its check also
	// runs on every refreshed config.
	LoadBalancers *loadbalancer.Registry
	// Fence, when set, bounds every provider Create and Delete by the
	// shard lease.
	Fence provider.Fence
	// Cache, when set, mirrors the instance records and the groups
	// document (SQLite); each term starts from it.
	Cache *cache.Cache
	// Trust is the cluster CA as it is now (handed to new instances);
	// Issuer signs client certificates; NonceKey signs agent nonces and
	// verifies registration nonces; WorkloadCAs sign what templates ask
	// for, each tenant's with its own CA (WorkloadCA instead: one CA for
	// every tenant, for tests and benchmarks).
	Trust       *pki.Trust
	Issuer      *registration.Issuer
	NonceKey    ed25519.PrivateKey
	WorkloadCAs *workloadca.Store
	WorkloadCA  *pki.CA
	// ServerHosts are this server's names and addresses beyond those the
	// config knows; no template certificate may carry them.
	ServerHosts []string
	// Revocations is the deny list: deleted instances' agent certificates
	// are revoked, and the admin RPCs list and revoke.
	Revocations *revocation.Gate
	// Leadership names the serving server and the start of its term
	// (GetConfigStatus); nil leaves them out.
	Leadership func() (serverID string, since time.Time)
	// Metrics, when set, observes the provider's calls and the reconcile
	// queue, and reads the fleet's stores at scrape time.
	Metrics *metrics.Server
	Tuning  Tuning
	Log     logr.Logger
	// Ring opens the cluster's encrypted secrets in Store (file secrets,
	// imported CAs' keys, tenants' user data) and Remote reads AWS secrets
	// for template files of kind secret (files.go); a nil Ring leaves those
	// out (their files are reported, not delivered; no imported CAs; no
	// user data accepted).
	Ring   *secrets.Keyring
	Remote secrets.Remote
}

// Tuning adjusts the reconciler and the Agent service beyond the config;
// zero values keep the defaults. nstance-server leaves it empty.
type Tuning struct {
	// ResyncInterval is the reconciler's periodic pass (default 30s);
	// RetryBase its first retry delay.
	ResyncInterval, RetryBase time.Duration
	// MonitorMock monitors agents' health even with the mock provider
	// (whose instances run no agents; tests feed reports themselves).
	MonitorMock bool
	// RepushInterval is how often the Agent service re-sends files.
	RepushInterval time.Duration
	// Now is the reconciler's clock (default time.Now).
	Now func() time.Time
}

// Assembly is everything one shard server serves and runs, built once by
// Assemble for the life of the process. What lives for one leadership term
// (the Agent service with its live table and keys; the reconciler's queue)
// is built by NewTerm each time: the shard leader serves Registration,
// Operator and the term's Agent service and runs LeadTerm for each term.
type Assembly struct {
	Config     *liveconfig.Holder
	Provider   provider.Provider
	Instances  *instances.Store
	Groups     *groups.Registry
	Events     *events.Hubs
	Reconciler *reconcile.Reconciler
	// Ops carries out the tenants' group and instance requests.
	Ops *tenantops.Ops
	// Registration is nil without Parts.Issuer and Parts.NonceKey.
	Registration *registration.Service
	Operator     *operatorsvc.Service
	// agentOptions are the Agent service's options but the per-term
	// parts (nil without Parts.WorkloadCAs or WorkloadCA: no Agent service).
	agentOptions *agentapi.Options
	// cur is the term LeadTerm runs (nil between terms).
	curMu sync.Mutex
	cur   *Term
	// Gate admits agent registrations against the instance records, the
	// provider's addresses and shard.registration of the live config.
	Gate *registration.InstanceGate
	// Revocations is Parts.Revocations (the deny list of client certificates).
	Revocations *revocation.Gate
	// Images resolves the templates' image_name args (nil: the provider
	// looks no images up).
	Images *imagelookup.Table
	// store and keys read the objects templates name (userdata_object).
	store objstore.Store
	keys  layout.Keys
}

// Term is what one leadership term serves agents with, built by NewTerm
// and dropped with the term: a server that leads again starts from empty
// ones, as a fresh leader would, and learns the fleet again from what the
// agents report and submit when they reconnect.
type Term struct {
	// Agents is the term's live table of agents (reports, versions,
	// notices, open streams); the reconciler reads it.
	Agents *agentlive.Table
	// Keys holds the keys agents submitted and the certificates issued.
	Keys *agentapi.MemKeyStore
	// Agent is the term's Agent service (nil: the assembly has none).
	Agent *agentapi.Server
}

// NewTerm builds the per-term parts of the Agent service.
func (s *Assembly) NewTerm() (*Term, error) {
	t := &Term{}
	if s.agentOptions == nil {
		return t, nil
	}
	t.Agents, t.Keys = agentlive.New(), agentapi.NewMemKeyStore()
	o := *s.agentOptions
	o.Live, o.Keys = t.Agents, t.Keys
	srv, err := agentapi.New(o)
	if err != nil {
		return nil, fmt.Errorf("building the Agent service: %w", err)
	}
	t.Agent = srv
	return t, nil
}

// LeadTerm is the shard leader's work for term t: the reconciler, until
// ctx (the term) ends.
func (s *Assembly) LeadTerm(ctx context.Context, t *Term) error {
	s.setTerm(t)
	defer s.clearTerm(t)
	return s.runTerm(ctx, t)
}

// setTerm makes t the term Term returns; clearTerm ends that, if t is it.
func (s *Assembly) setTerm(t *Term) {
	s.curMu.Lock()
	defer s.curMu.Unlock()
	s.cur = t
}

func (s *Assembly) clearTerm(t *Term) {
	s.curMu.Lock()
	defer s.curMu.Unlock()
	if s.cur == t {
		s.cur = nil
	}
}

// runTerm runs the reconciler with t's agents until ctx ends; with image
// lookups, it looks the images up first and then at their interval.
func (s *Assembly) runTerm(ctx context.Context, t *Term) error {
	ag := reconcile.Agents{Live: t.Agents}
	if t.Agent != nil {
		ag.Files = t.Agent
	}
	if s.Images != nil {
		s.Images.Refresh(ctx)
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Images.Run(ctx)
		}()
		defer wg.Wait()
		defer cancel()
	}
	return s.Reconciler.Run(ctx, ag)
}

// imageLookupFailed reports a failed image lookup to the tenants of the
// groups whose template names the image (their error events), keeping id.
func (s *Assembly) imageLookupFailed(name, kept string, err error) {
	what := "no image yet"
	if kept != "" {
		what = "keeping " + kept
	}
	err = fmt.Errorf("image %q: lookup failed, %s: %w", name, what, err)
	cfg := s.Config.Current()
	reported := false
	for _, g := range s.Groups.List("") {
		eff, rerr := groups.Resolve(cfg, &g.Spec, groups.Overrides{})
		if rerr == nil && g.Spec.Image == "" && eff.Args[provider.ArgImageName] == name {
			s.Reconciler.ReportInstanceError(g.Tenant, g.ID, "", err)
			reported = true
		}
	}
	if !reported {
		s.Reconciler.ReportInstanceError("", "", "", err)
	}
}

// Lead runs one term with new per-term parts (tests and benchmarks that
// lead without elections and gRPC).
func (s *Assembly) Lead(ctx context.Context) error {
	t, err := s.NewTerm()
	if err != nil {
		return err
	}
	return s.LeadTerm(ctx, t)
}

// Term returns the term LeadTerm runs (nil between terms).
func (s *Assembly) Term() *Term {
	s.curMu.Lock()
	defer s.curMu.Unlock()
	return s.cur
}

// Assemble builds every service of a shard server and its leadership work
// from the config, in this order: live config, provider, instance records,
// groups and events, the registration gate, the Agent service, the
// reconciler, the Operator service and the Registration service.
func Assemble(p Parts) (*Assembly, error) {
	cfg := p.Config
	if cfg == nil {
		return nil, fmt.Errorf("assembling the server: no config loaded")
	}
	shard := cfg.Shard.ID
	lim := cfg.Shard.Limits.WithDefaults()
	log := p.Log
	holder := liveconfig.New(p.Store, p.Keys.Config(shard), cfg, p.ConfigETag, p.ConfigModified)
	if p.Provider == nil && p.Providers != nil {
		// The registry builds the provider, so it judges every refreshed
		// shard.infra too.
		holder.Checks = []config.Check{p.Providers.Check}
	}
	lbKinds := p.LoadBalancers
	if lbKinds == nil {
		lbKinds = loadbalancer.NewRegistry()
	}
	holder.Checks = append(holder.Checks, lbKinds.Check)
	s := &Assembly{Config: holder, Revocations: p.Revocations, store: p.Store, keys: p.Keys}

	// The provider: the one place the instance backend is chosen.
	prov := p.Provider
	if prov == nil {
		local := p.Local
		if d := cfg.Shard.HealthCheckInterval.D(); d > 0 {
			// Local agents report at the interval the server expects.
			local.Env = append(append([]string{}, local.Env...), "NSTANCE_METRICS_INTERVAL="+d.String())
		}
		if p.Providers == nil {
			return nil, fmt.Errorf("assembling the server: no provider and no provider registry")
		}
		var err error
		if prov, err = p.Providers.New(context.Background(), provider.Env{Config: holder.Current, Local: local, Log: log.WithName("provider")}); err != nil {
			return nil, err
		}
	}
	// Images the templates name (image_name), looked up by the provider
	// (taken before the wrappers below, which hide it): the reconciler and
	// the tenant operations see the config with the resolved ids.
	cfgFn := holder.Current
	if r, ok := prov.(provider.ImageResolver); ok && len(r.ImageNames()) > 0 {
		s.Images = &imagelookup.Table{Resolver: r}
		cfgFn = s.Images.Config(holder.Current)
	}
	// Instance types: the config's catalog, then the provider's own lookup
	// (taken before the wrappers below, which hide it).
	catalog := provider.Catalog{Config: holder.Current}
	if d, ok := prov.(provider.InstanceTypeDescriber); ok {
		catalog.Provider = d
	}
	if p.Metrics != nil {
		prov = provider.Instrumented(prov, p.Metrics.Provider())
	}
	// Load balancers: one provider per load_balancers entry, for the life
	// of the process (a change of the entries applies at the next start).
	lbs, err := lbKinds.NewAll(context.Background(), loadbalancer.Env{Config: holder.Current, Log: log.WithName("loadbalancer")})
	if err != nil {
		return nil, fmt.Errorf("assembling the server: %w", err)
	}
	if p.Fence != nil {
		// A server whose shard lease has lapsed creates, deletes and
		// attaches nothing, even from work that has not noticed yet.
		prov = provider.Fenced(prov, p.Fence)
	}
	s.Provider = prov

	// The SQLite cache: each term starts from it, then checks it against
	// storage; it receives every change.
	var mirror instances.Mirror
	if p.Cache != nil {
		mirror = instances.CacheMirror{Cache: p.Cache}
	}
	s.Instances = instances.NewStore(p.Store, p.Keys, shard, mirror)
	s.Groups = groups.NewRegistry(p.Store, p.Keys, shard)
	if p.Cache != nil {
		s.Groups.SetMirror(groups.CacheMirror{Cache: p.Cache, Key: p.Keys.Groups(shard)})
	}
	s.Events = events.NewHubs(lim.WatchBuffer)
	s.Gate = &registration.InstanceGate{Records: s.Instances, Now: p.Tuning.Now, Policy: func() registration.SourcePolicy {
		r := holder.Current().Shard.Registration
		return registration.SourcePolicy{Off: r.SourceCheckOff(), TrustedProxies: r.Proxies()}
	}, ProviderAddresses: func(ctx context.Context, id string) ([]string, error) {
		inst, err := prov.Status(ctx, id)
		if err != nil {
			return nil, err
		}
		return inst.Addresses, nil
	}}

	t := p.Tuning
	ro := reconcile.Options{
		Cluster: cfg.Cluster.ID, Shard: shard, Config: cfgFn, Groups: s.Groups, Instances: s.Instances,
		Provider: prov, RegistrationAddr: cfg.Shard.Advertise.RegistrationAddr, AgentAddr: cfg.Shard.Advertise.AgentAddr,
		Events: s.Events, Log: log, ResyncInterval: t.ResyncInterval, RetryBase: t.RetryBase, Now: t.Now,
		LoadBalancers: lbs,
	}
	if p.Metrics != nil {
		ro.LBCalls = p.Metrics.LoadBalancerCall
	}
	if p.NonceKey != nil {
		ro.Nonces = reconcile.KeyMinter{Key: p.NonceKey, ClusterID: cfg.Cluster.ID, Shard: shard, TTL: cfg.Certificates.AgentNonceTTL.D()}
	}
	if p.Trust != nil {
		// Every trusted CA: both while the cluster CA rotates.
		ro.CACert = func(context.Context) ([]byte, error) { return p.Trust.BundlePEM(), nil }
	}
	var ud *userdata.Store
	if p.Ring != nil {
		// Tenants' bootstrap data is sealed with the cluster key and written
		// through the fenced store.
		ud = &userdata.Store{Secrets: &secrets.Store{Objects: p.Store, Ring: p.Ring}, Keys: p.Keys, Shard: shard}
	}
	ro.UserData = func(ctx context.Context, rec *instances.Record) ([]byte, string, error) {
		return s.bootUserData(ctx, ud, rec)
	}
	if ud != nil {
		ro.PruneUserData = ud.Prune
	}
	if p.Revocations != nil {
		ro.RevokeAgent = func(ctx context.Context, id, reason string) error {
			_, err := p.Revocations.RevokeAgent(ctx, id, reason)
			return err
		}
	}
	// The mock provider runs no agents, so there is nothing to monitor.
	monitor := cfg.Shard.Infra.Provider != "mock" || t.MonitorMock
	if p.WorkloadCAs != nil || p.WorkloadCA != nil {
		files := fileSources(p, holder, lim.MaxFileBytes, log)
		src := &agentapi.TemplateSource{Lookup: s.templateInput, Secret: files.Secret, Storage: files.Object}
		policy := func() pki.WorkloadPolicy { return holder.Current().WorkloadPolicy(p.ServerHosts...) }
		ws := &agentapi.WorkloadSigner{MaxValidity: cfg.Certificates.AgentValidity.D(), Policy: policy}
		if p.WorkloadCAs != nil {
			// Each tenant's certificates from its own CA, and its
			// instances' ca_bundle its own CA's bundle.
			src.Bundle, ws.CAs = p.WorkloadCAs.Bundle, p.WorkloadCAs.CA
		} else {
			src.CABundle, ws.CA = p.WorkloadCA.CertPEM, p.WorkloadCA
		}
		signer := agentapi.CASigners{Workload: ws}
		if p.Ring != nil {
			cas := &importedca.Cache{Store: &importedca.Store{Objects: p.Store, Keys: p.Keys, Secrets: &secrets.Store{Objects: p.Store, Ring: p.Ring}}}
			signer.Imported = &agentapi.ImportedSigner{CA: cas.Get, MaxValidity: cfg.Certificates.AgentValidity.D(), Policy: policy,
				DeniedGroups: func() []string { return holder.Current().Certificates.DeniedGroupsAll() },
				Alive:        s.instanceAlive}
		}
		ao := agentapi.Options{
			Shard: shard, Source: src, Signer: signer,
			Log: log.WithName("agentapi"), RepushInterval: t.RepushInterval, MaxFileBytes: lim.MaxFileBytes,
		}
		if p.Issuer != nil {
			ao.RenewIdentity = p.Issuer.RenewAgentPEM
		}
		if p.Revocations != nil {
			ao.RevokeInstance = func(ctx context.Context, id, reason string) error {
				_, err := p.Revocations.RevokeAgent(ctx, id, reason)
				return err
			}
		}
		s.agentOptions = &ao
		ro.MonitorAgents = monitor
	}

	// The reconciler: the shard leader's work (LeadTerm).
	if p.Metrics != nil {
		ro.QueueMetrics = p.Metrics.QueueMetrics()
	}
	s.Reconciler = reconcile.New(ro)
	if s.agentOptions != nil {
		// What the Agent service refuses an instance is reported as the
		// instance's error.
		s.agentOptions.Refusals = s.Reconciler
		// Built once here to check the options: every term builds its own.
		if _, err := s.NewTerm(); err != nil {
			return nil, fmt.Errorf("assembling the Agent service: %w", err)
		}
	}
	holder.OnChange(func(old, cur *config.Config) { s.Reconciler.ConfigChanged() })
	if s.Images != nil {
		s.Images.OnChange = s.Reconciler.ConfigChanged
		s.Images.OnError = s.imageLookupFailed
	}

	s.Ops = tenantops.New(tenantops.Options{Shard: shard, Config: cfgFn, Groups: s.Groups, Instances: s.Instances,
		Reconciler: s.Reconciler, UserData: ud, Now: t.Now})
	s.Operator = operatorsvc.New(operatorsvc.Options{Shard: shard, Reconciler: s.Reconciler, Ops: s.Ops, Config: holder,
		Issuer: p.Issuer, Operators: &operatorsvc.OperatorRecords{Store: p.Store, Keys: p.Keys}, Log: log.WithName("operator"),
		Revocations: p.Revocations, Leadership: p.Leadership, InstanceTypes: catalog})

	if p.Metrics != nil {
		p.Metrics.SetFleet(fleetMetrics(s))
	}

	if p.Issuer != nil && p.NonceKey != nil {
		s.Registration = registration.New(registration.Options{
			ClusterID: cfg.Cluster.ID, Shard: shard, ServerID: p.ServerID, Issuer: p.Issuer,
			NonceKey: p.NonceKey.Public().(ed25519.PublicKey), NonceMaxLifetime: cfg.Certificates.NonceMaxLifetime.D(),
			Store: p.Store, Keys: p.Keys, Instances: s.Gate, Log: log.WithName("registration"),
		})
	}
	return s, nil
}

// templateInput resolves what an agent's files are rendered from: the
// instance's template from the running config, and for group members the
// vars their group resolves to now (so a var change is pushed); on-demand
// instances keep the vars they were created with.
func (s *Assembly) templateInput(_ context.Context, ref agentapi.Ref) (*agentapi.TemplateInput, error) {
	rec, ok := s.Instances.Get(ref.InstanceID)
	if !ok || rec.Tenant != ref.Tenant {
		return nil, fmt.Errorf("%w: %s", agentapi.ErrUnknownInstance, ref.InstanceID)
	}
	cfg := s.Config.Current()
	t, ok := cfg.Templates[rec.Template]
	if !ok {
		return nil, fmt.Errorf("instance %s: template %q is not in the running config", rec.ID, rec.Template)
	}
	// A template whose tenants list no longer names the instance's tenant
	// renders nothing for it: no files, no certificates.
	if reason := cfg.CheckTemplateTenant(rec.Template, rec.Tenant); reason != "" {
		return nil, fmt.Errorf("instance %s: %s", rec.ID, reason)
	}
	vars := rec.Vars
	if rec.GroupID != "" && !rec.OnDemand {
		if g, ok := s.Groups.Get(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID}); ok {
			if eff, err := groups.Resolve(cfg, &g.Spec, groups.Overrides{}); err == nil && eff.Template == rec.Template {
				vars = eff.Vars
			}
		}
	}
	return &agentapi.TemplateInput{Template: t, Data: agentapi.TemplateData{
		InstanceID: rec.ID, Tenant: rec.Tenant, Cluster: cfg.Cluster.ID, Shard: rec.Shard, Group: rec.GroupID, Template: rec.Template,
		InstanceType: rec.InstanceType, Vars: maps.Clone(vars), Args: maps.Clone(rec.Args), Image: rec.Args[provider.ArgImage],
		Instance: config.NewInstanceData(rec.ID, rec.InstanceType, cfg.Shard.InstanceDomain, rec.Addresses),
	}, TrustedVars: trustedVars(cfg, rec)}, nil
}

// bootUserData is the bootstrap data an instance is created with: what its
// tenant sent (stored encrypted), else its template's userdata rendered for
// it. Either way it is checked against shard.limits.max_user_data_bytes.
func (s *Assembly) bootUserData(ctx context.Context, ud *userdata.Store, rec *instances.Record) ([]byte, string, error) {
	cfg := s.Config.Current()
	what := "group " + rec.GroupID
	if rec.GroupID == "" || rec.OnDemand {
		what = "on-demand instance " + rec.ID
	}
	limit := cfg.Shard.Limits.WithDefaults().MaxUserDataBytes
	if rec.UserDataSHA256 != "" {
		data, err := ud.Get(ctx, rec.Tenant, rec.UserDataSHA256)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", what, err)
		}
		return data, rec.UserDataFormat, userdata.CheckSize(what, data, limit)
	}
	t, ok := cfg.Templates[rec.Template]
	if !ok {
		return nil, "", fmt.Errorf("template %q is not in the running config", rec.Template)
	}
	data := agentapi.TemplateData{
		InstanceID: rec.ID, Tenant: rec.Tenant, Cluster: cfg.Cluster.ID, Shard: rec.Shard, Group: rec.GroupID, Template: rec.Template,
		InstanceType: rec.InstanceType, Vars: maps.Clone(rec.Vars), Args: maps.Clone(rec.Args), Image: rec.Args[provider.ArgImage],
		Instance: config.NewInstanceData(rec.ID, rec.InstanceType, cfg.Shard.InstanceDomain, nil),
	}
	out, err := userdata.Render(ctx, "templates."+rec.Template, t, data, func(ctx context.Context, key string) ([]byte, error) {
		obj, err := s.store.Get(ctx, s.keys.Object(key))
		if err != nil {
			return nil, err
		}
		return obj.Body, nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, userdata.FormatCloudConfig, userdata.CheckSize(what, out, limit)
}

// trustedVars are the vars the config itself gives an instance: defaults <
// template < its static group's (dynamic groups and on-demand requests
// come from a tenant).
func trustedVars(cfg *config.Config, rec *instances.Record) map[string]string {
	out := map[string]string{}
	maps.Copy(out, cfg.Defaults.Vars)
	if t, ok := cfg.Templates[rec.Template]; ok {
		maps.Copy(out, t.Vars)
	}
	if g, ok := cfg.Groups[rec.Tenant][rec.GroupID]; ok && rec.GroupID != "" && g.Template == rec.Template {
		maps.Copy(out, g.Vars)
	}
	return out
}

// instanceAlive refuses certificates of imported CAs to instances whose
// record is gone, belongs to another tenant, or is being deleted.
func (s *Assembly) instanceAlive(_ context.Context, ref agentapi.Ref) error {
	rec, ok := s.Instances.Get(ref.InstanceID)
	switch {
	case !ok || rec.Tenant != ref.Tenant:
		return fmt.Errorf("%w: %s", agentapi.ErrUnknownInstance, ref.InstanceID)
	case rec.State == instances.StateDeleting || rec.State == instances.StateDeleted:
		return fmt.Errorf("instance %s is %s: no new certificates", rec.ID, rec.State)
	}
	return nil
}
