package fleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/events"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/layout"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	"github.com/nstance-dev/nstance/pkg/objstore"
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
	// Mirror receives instance record changes (the SQLite cache); optional.
	Mirror         instances.Mirror
	Log            logr.Logger
	Workers        int
	ResyncInterval time.Duration
	RetryBase      time.Duration
	EventBuffer    int
}

// Fleet is the assembled instance management of one shard.
type Fleet struct {
	Reconciler *reconcile.Reconciler
	Service    *operatorsvc.Service
	Instances  *instances.Store
	Groups     *groups.Registry
	Events     *events.Hubs
}

// New assembles a fleet. The config holder must already hold a config.
func New(o Options) (*Fleet, error) {
	cfg := o.Config.Current()
	if cfg == nil {
		return nil, fmt.Errorf("fleet: no config loaded")
	}
	shard := cfg.Shard.ID
	hubs := events.NewHubs(o.EventBuffer)
	store := instances.NewStore(o.Store, o.Keys, shard, o.Mirror)
	reg := groups.NewRegistry(o.Store, o.Keys, shard)
	rec := reconcile.New(reconcile.Options{
		Cluster: cfg.Cluster.ID, Shard: shard, Config: o.Config.Current, Groups: reg, Instances: store,
		Provider: o.Provider, Nonces: o.Nonces, CACert: o.CACert, RegistrationAddr: o.RegistrationAddr,
		AgentAddr: o.AgentAddr, Events: hubs, Log: o.Log, Workers: o.Workers, ResyncInterval: o.ResyncInterval,
		RetryBase: o.RetryBase,
	})
	o.Config.OnChange(func(old, cur *config.Config) { rec.ConfigChanged() })
	svc := operatorsvc.New(operatorsvc.Options{Shard: shard, Reconciler: rec, Config: o.Config, Renewer: o.Renewer, Tenant: o.Tenant})
	return &Fleet{Reconciler: rec, Service: svc, Instances: store, Groups: reg, Events: hubs}, nil
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
			Socket: opt("socket", lo.Socket, ""), StateDir: stateDir, NodeDir: nodeDir, WorkDir: workDir,
		})
	case "process":
		cmd := strings.Fields(opt("command", lo.Command, "bin/nstance-agent"))
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, err
		}
		return process.New(process.Config{Command: cmd, StateDir: stateDir, NodeDir: nodeDir, WorkDir: workDir})
	}
	return nil, fmt.Errorf("shard.infra.provider: unsupported provider %q (want tmux, process or mock)", infra.Provider)
}
