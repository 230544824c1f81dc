package provider

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/kindset"
)

// Kind is one provider implementation the server can run, selected by
// shard.infra.provider. Each kind owns its configuration: the type of its
// shard.infra.options block, that block's defaults and its validation.
type Kind struct {
	// Name is the value of shard.infra.provider that selects the kind.
	Name string
	// Config returns a fresh configuration holding the kind's defaults; the
	// options block is decoded onto it strictly (config.DecodeBlock), so its
	// fields need json tags.
	Config func() KindConfig
}

// KindConfig is the decoded shard.infra.options of one kind.
type KindConfig interface {
	// Validate checks the decoded block against the rest of the document
	// (shard.infra's region and zone, subnet pools, template args). Keys are
	// full paths, e.g. "shard.infra.options.command".
	Validate(cfg *config.Config) config.Errors
	// New builds the provider. The config has been validated.
	New(ctx context.Context, env Env) (Provider, error)
}

// Env is what a kind gets besides its options block.
type Env struct {
	// Config returns the shard's current config (the live one while the
	// server runs): cluster and shard ids, shard.infra, subnet pools.
	Config func() *config.Config
	// Local are overrides from the server's command line for the local
	// providers; kinds without local processes use only its Env.
	Local Local
	Log   logr.Logger
}

// Local are settings of the local (development) providers that come from
// flags or the server's own environment rather than the config file. Empty
// fields leave the options block's value (or the kind's default) in place.
type Local struct {
	// Command replaces options.command.
	Command string
	// StateDir, NodeDir and WorkDir replace options.state_dir, node_dir and work_dir.
	StateDir, NodeDir, WorkDir string
	// Session and Socket replace the tmux options.
	Session, Socket string
	// Env is added to every agent's environment (KEY=VALUE), whatever the
	// kind (e.g. NSTANCE_METRICS_INTERVAL).
	Env []string
}

// Registry maps kind names to kinds. It is a plain value built once by the
// server's assembly (NewRegistry with the kinds the binary ships) and only
// read afterwards.
type Registry struct {
	kinds kindset.Set[Kind]
}

// NewRegistry returns a registry of kinds. Two kinds with one name, an empty
// name or a nil Config are programming errors and panic.
func NewRegistry(kinds ...Kind) *Registry {
	return &Registry{kinds: kindset.New("provider", func(k Kind) string { return k.Name }, func(k Kind) bool { return k.Config != nil }, kinds...)}
}

// Names returns the registered kind names, sorted.
func (r *Registry) Names() []string { return r.kinds.Names() }

// Decode resolves cfg's shard.infra to its kind's configuration: the
// options block decoded strictly onto the kind's defaults, then validated.
// Problems are config.Errors with full keys (shard.infra.options.…).
func (r *Registry) Decode(cfg *config.Config) (KindConfig, error) {
	infra := cfg.Shard.Infra
	k, ok := r.kinds.Get(infra.Provider)
	if !ok {
		return nil, config.Errors{{Key: "shard.infra.provider",
			Reason: fmt.Sprintf("unknown provider %q (want one of %s)", infra.Provider, strings.Join(r.Names(), ", "))}}
	}
	kc := k.Config()
	if errs := config.DecodeBlock("shard.infra.options", infra.Options, kc); len(errs) > 0 {
		return nil, errs
	}
	if errs := kc.Validate(cfg); len(errs) > 0 {
		return nil, errs
	}
	return kc, nil
}

// Check is a config.Check: it reports what Decode finds wrong with the
// document's shard.infra.
func (r *Registry) Check(cfg *config.Config) config.Errors {
	if cfg.Shard.Infra.Provider == "" {
		return nil // config.Validate already says it is required
	}
	if _, err := r.Decode(cfg); err != nil {
		if es, ok := config.AsErrors(err); ok {
			return es
		}
		return config.Errors{{Key: "shard.infra", Reason: err.Error()}}
	}
	return nil
}

// New builds the provider the current config's shard.infra selects. A
// change of shard.infra while the server runs takes effect at its next
// start.
func (r *Registry) New(ctx context.Context, env Env) (Provider, error) {
	cfg := env.Config()
	kc, err := r.Decode(cfg)
	if err != nil {
		return nil, err
	}
	p, err := kc.New(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", cfg.Shard.Infra.Provider, err)
	}
	return p, nil
}
