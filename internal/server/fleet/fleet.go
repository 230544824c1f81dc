package fleet

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/events"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Options configures a Fleet.
type Options struct {
	Store  objstore.Store
	Keys   layout.Keys
	Config *liveconfig.Holder
	// Provider is the infrastructure backend (see NewProvider).
	Provider provider.Provider
	Nonces   reconcile.NonceMinter
	CACert   func(ctx context.Context) ([]byte, error)
	// RegistrationAddr and AgentAddr are the endpoints handed to agents.
	RegistrationAddr string
	AgentAddr        string
	Renewer          operatorsvc.CertificateRenewer
	// Tenant overrides how the caller's tenant is read (default: authz identity).
	Tenant operatorsvc.TenantFunc
	// Leadership names the serving server and its term start (GetConfigStatus).
	Leadership func() (serverID string, since time.Time)
	// Mirror receives instance record changes (the SQLite cache); optional.
	Mirror         instances.Mirror
	Log            logr.Logger
	Workers        int
	ResyncInterval time.Duration
	RetryBase      time.Duration
	EventBuffer    int
	// Now is the reconciler's clock (default time.Now); tests move it.
	Now func() time.Time
	// Agent, when its CA is set, builds the Agent service.
	Agent AgentOptions
	// Revocations, when set, is the deny list: deleted instances' agent
	// certificates are revoked, and the admin RPCs list and revoke.
	Revocations *revocation.Gate
	// QueueMetrics, when set, receives the reconcile queue's metrics.
	QueueMetrics workqueue.MetricsProvider
}

// AgentOptions configure the Agent service of a fleet.
type AgentOptions struct {
	// WorkloadCA signs the certificates of agent-generated keys (what
	// templates ask for); nil means no Agent service.
	WorkloadCA *pki.CA
	// ServerHosts are server names and addresses beyond those the config
	// knows (flags, host name) that no template certificate may carry.
	ServerHosts []string
	// CertValidity caps issued certificates (default 24h).
	CertValidity time.Duration
	// Secret resolves files of kind secret; nil rejects them.
	Secret func(ctx context.Context, name string) ([]byte, error)
	// Monitor turns on health monitoring (off for providers without agents).
	Monitor bool
	// HealthInterval, HealthMisses, StartupGrace and Surge tune the
	// reconciler (see reconcile.Options).
	HealthInterval time.Duration
	HealthMisses   int
	StartupGrace   time.Duration
	Surge          int
	// RepushInterval is passed to agentapi.
	RepushInterval time.Duration
	// RenewIdentity renews agents' cluster-CA identity certificates through
	// the Agent streams (agentapi.Options.RenewIdentity); nil: no renewal.
	RenewIdentity agentapi.RenewIdentityFunc
	// OnReport, when set, also sees every accepted health report (after the reconciler).
	OnReport func(ctx context.Context, ref agentapi.Ref, report *nstancev1.HealthReport, received time.Time)
}

// Fleet is the assembled instance management of one shard.
type Fleet struct {
	Reconciler *reconcile.Reconciler
	Service    *operatorsvc.Service
	Instances  *instances.Store
	Groups     *groups.Registry
	Events     *events.Hubs
	// Agent is the Agent service (nil without AgentOptions.WorkloadCA), with its
	// key store and health tracker.
	Agent     *agentapi.Server
	AgentKeys *agentapi.MemKeyStore
	Health    *agentapi.Tracker
	// Gate admits agent registrations against the instance records, the
	// provider's addresses and shard.registration of the live config.
	Gate *registration.InstanceGate
}

// New assembles a fleet. The config holder must already hold a config.
func New(o Options) (*Fleet, error) {
	cfg := o.Config.Current()
	if cfg == nil {
		return nil, fmt.Errorf("fleet: no config loaded")
	}
	shard := cfg.Shard.ID
	lim := cfg.Shard.Limits.WithDefaults()
	if o.EventBuffer <= 0 {
		o.EventBuffer = lim.WatchBuffer
	}
	hubs := events.NewHubs(o.EventBuffer)
	store := instances.NewStore(o.Store, o.Keys, shard, o.Mirror)
	reg := groups.NewRegistry(o.Store, o.Keys, shard)
	f := &Fleet{Instances: store, Groups: reg, Events: hubs}
	f.Gate = &registration.InstanceGate{Records: store, Now: o.Now, Policy: func() registration.SourcePolicy {
		r := o.Config.Current().Shard.Registration
		return registration.SourcePolicy{Off: r.SourceCheckOff(), TrustedProxies: r.Proxies()}
	}}
	if p := o.Provider; p != nil {
		f.Gate.ProviderAddresses = func(ctx context.Context, id string) ([]string, error) {
			inst, err := p.Status(ctx, id)
			if err != nil {
				return nil, err
			}
			return inst.Addresses, nil
		}
	}
	ro := reconcile.Options{
		Cluster: cfg.Cluster.ID, Shard: shard, Config: o.Config.Current, Groups: reg, Instances: store,
		Provider: o.Provider, Nonces: o.Nonces, CACert: o.CACert, RegistrationAddr: o.RegistrationAddr,
		AgentAddr: o.AgentAddr, Events: hubs, Log: o.Log, Workers: o.Workers, ResyncInterval: o.ResyncInterval,
		RetryBase: o.RetryBase, HealthInterval: o.Agent.HealthInterval, HealthMisses: o.Agent.HealthMisses,
		StartupGrace: o.Agent.StartupGrace, Surge: o.Agent.Surge, Now: o.Now, QueueMetrics: o.QueueMetrics,
	}
	if o.Revocations != nil {
		ro.RevokeAgent = func(ctx context.Context, id, reason string) error {
			_, err := o.Revocations.RevokeAgent(ctx, id, reason)
			return err
		}
	}
	if ao := o.Agent; ao.WorkloadCA != nil {
		if ao.CertValidity <= 0 {
			ao.CertValidity = 24 * time.Hour
		}
		f.AgentKeys, f.Health = agentapi.NewMemKeyStore(), agentapi.NewTracker()
		src := &agentapi.TemplateSource{Lookup: f.templateInput(o.Config), Secret: ao.Secret, CABundle: ao.WorkloadCA.CertPEM}
		holder, extra := o.Config, ao.ServerHosts
		signer := &agentapi.WorkloadSigner{CA: ao.WorkloadCA, MaxValidity: ao.CertValidity,
			Policy: func() pki.WorkloadPolicy { return holder.Current().WorkloadPolicy(extra...) }}
		srv, err := agentapi.New(agentapi.Options{
			Shard: shard, Source: src, Keys: f.AgentKeys, Signer: signer,
			Health: f.Health, Log: o.Log.WithName("agentapi"), RepushInterval: ao.RepushInterval,
			MaxFileBytes: lim.MaxFileBytes, RenewIdentity: ao.RenewIdentity,
			OnRefused: func(ref agentapi.Ref, err error) {
				f.Reconciler.ReportInstanceError(ref.Tenant, ref.Group, ref.InstanceID, err)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		f.Agent = srv
		ro.Agents = agentHooks{f}
		if ao.Monitor {
			ro.Health = f.Health
		}
	}
	f.Reconciler = reconcile.New(ro)
	if f.Health != nil {
		r, monitor, observe := f.Reconciler, o.Agent.Monitor, o.Agent.OnReport
		f.Health.OnReport = func(ctx context.Context, ref agentapi.Ref, rep *nstancev1.HealthReport, at time.Time) {
			if monitor {
				r.AgentReported(ref.InstanceID, rep.GetTermination())
			}
			if observe != nil {
				observe(ctx, ref, rep, at)
			}
		}
	}
	o.Config.OnChange(func(old, cur *config.Config) { f.Reconciler.ConfigChanged() })
	f.Service = operatorsvc.New(operatorsvc.Options{Shard: shard, Reconciler: f.Reconciler, Config: o.Config, Renewer: o.Renewer, Tenant: o.Tenant, Leadership: o.Leadership,
		Revocations: o.Revocations})
	return f, nil
}

// agentHooks connects the reconciler to the Agent service.
type agentHooks struct{ f *Fleet }

func (h agentHooks) Notify(ids ...string) { h.f.Agent.Notify(ids...) }

func (h agentHooks) Forget(id string) {
	h.f.AgentKeys.Forget(id)
	h.f.Health.Forget(id)
}

// templateInput resolves what an agent's files are rendered from: the
// instance's template from the running config, and for group members the
// vars their group resolves to now (so a var change is pushed); on-demand
// instances keep the vars they were created with.
func (f *Fleet) templateInput(holder *liveconfig.Holder) func(context.Context, agentapi.Ref) (*agentapi.TemplateInput, error) {
	return func(_ context.Context, ref agentapi.Ref) (*agentapi.TemplateInput, error) {
		rec, ok := f.Instances.Get(ref.InstanceID)
		if !ok || rec.Tenant != ref.Tenant {
			return nil, fmt.Errorf("%w: %s", agentapi.ErrUnknownInstance, ref.InstanceID)
		}
		cfg := holder.Current()
		t, ok := cfg.Templates[rec.Template]
		if !ok {
			return nil, fmt.Errorf("instance %s: template %q is not in the running config", rec.ID, rec.Template)
		}
		vars := rec.Vars
		if rec.GroupID != "" && !rec.OnDemand {
			if g, ok := f.Groups.Get(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID}); ok {
				if eff, err := groups.Resolve(cfg, &g.Spec, groups.Overrides{}); err == nil && eff.Template == rec.Template {
					vars = eff.Vars
				}
			}
		}
		return &agentapi.TemplateInput{Template: t, Data: agentapi.TemplateData{
			InstanceID: rec.ID, Tenant: rec.Tenant, Shard: rec.Shard, Group: rec.GroupID, Template: rec.Template,
			InstanceType: rec.InstanceType, Vars: maps.Clone(vars), Args: maps.Clone(rec.Args),
		}}, nil
	}
}

// Run reconciles until ctx ends (one leadership term).
func (f *Fleet) Run(ctx context.Context) error { return f.Reconciler.Run(ctx) }

// LocalOptions are the settings of the local providers that do not come
// from the config file.
type LocalOptions struct {
	// StateDir holds per-instance identity directories (default temp/agents).
	StateDir string
	// NodeDir receives fake Node JSON files (default temp/dev-k8s/nodes; "-" disables).
	NodeDir string
	// WorkDir is where agent commands start (default: current directory).
	WorkDir string
	// Command overrides shard.infra.options.command.
	Command string
	// Session and Socket override the tmux options.
	Session, Socket string
	// Env is added to every agent's environment (KEY=VALUE).
	Env []string
}

// NewProvider builds the provider named by shard.infra.provider. Options read
// from shard.infra.options: command (agent command; tmux default
// "air -c scripts/air/agent.toml", process default "bin/nstance-agent"),
// session and socket (tmux), state_dir, node_dir, work_dir.
func NewProvider(infra config.Infra, lo LocalOptions) (provider.Provider, error) {
	opt := func(name, override, def string) string {
		if override != "" {
			return override
		}
		if v, ok := infra.Options[name].(string); ok && v != "" {
			return v
		}
		return def
	}
	stateDir := opt("state_dir", lo.StateDir, filepath.Join("temp", "agents"))
	nodeDir := opt("node_dir", lo.NodeDir, filepath.Join("temp", "dev-k8s", "nodes"))
	if nodeDir == "-" {
		nodeDir = ""
	}
	workDir := opt("work_dir", lo.WorkDir, "")
	switch infra.Provider {
	case "mock":
		return mock.New(), nil
	case "tmux":
		return tmux.New(tmux.Config{
			Command: opt("command", lo.Command, "air -c scripts/air/agent.toml"), Session: opt("session", lo.Session, tmux.DefaultSession),
			Socket: opt("socket", lo.Socket, ""), StateDir: stateDir, NodeDir: nodeDir, WorkDir: workDir, Env: lo.Env,
		})
	case "process":
		cmd := strings.Fields(opt("command", lo.Command, "bin/nstance-agent"))
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, err
		}
		return process.New(process.Config{Command: cmd, StateDir: stateDir, NodeDir: nodeDir, WorkDir: workDir, Env: lo.Env})
	}
	return nil, fmt.Errorf("shard.infra.provider: unsupported provider %q (want tmux, process or mock)", infra.Provider)
}
