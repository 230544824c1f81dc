package loadbalancer

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/config"
)

// Kind is one load balancer implementation, selected by an entry's
// "provider". Each kind owns the rest of the entry: its type, defaults and
// validation.
type Kind struct {
	// Name is the value of load_balancers.<name>.provider that selects it.
	Name string
	// Config returns a fresh settings value holding the kind's defaults; the
	// entry (without "provider") is decoded onto it strictly
	// (config.DecodeBlock), so its fields need json tags.
	Config func() KindConfig
}

// KindConfig is the decoded settings of one entry.
type KindConfig interface {
	// Validate checks the settings; key is the entry's path
	// ("load_balancers.www") and problems name full paths below it.
	Validate(cfg *config.Config, key string) config.Errors
	// New builds the entry's provider. The settings have been validated.
	New(ctx context.Context, env Env) (Provider, error)
}

// Env is what a kind gets besides its settings.
type Env struct {
	// Name is the entry's name (the key under load_balancers).
	Name string
	// Config returns the shard's current config (cluster and shard ids,
	// e.g. for ownership names and tags).
	Config func() *config.Config
	Log    logr.Logger
}

// Registry maps kind names to kinds: a plain value built once by the
// server's assembly with the kinds the binary ships, only read afterwards.
type Registry struct {
	kinds map[string]Kind
}

// NewRegistry returns a registry of kinds. Two kinds with one name, an empty
// name or a nil Config are programming errors and panic.
func NewRegistry(kinds ...Kind) *Registry {
	r := &Registry{kinds: make(map[string]Kind, len(kinds))}
	for _, k := range kinds {
		if k.Name == "" || k.Config == nil {
			panic(fmt.Sprintf("loadbalancer: kind %q has no name or no Config", k.Name))
		}
		if _, dup := r.kinds[k.Name]; dup {
			panic(fmt.Sprintf("loadbalancer: kind %q registered twice", k.Name))
		}
		r.kinds[k.Name] = k
	}
	return r
}

// Names returns the registered kind names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.kinds))
	for n := range r.kinds {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Decode resolves the entry name of cfg's load_balancers to its kind's
// settings: decoded strictly onto the kind's defaults, then validated.
// Problems are config.Errors with full keys (load_balancers.www.port).
func (r *Registry) Decode(cfg *config.Config, name string) (KindConfig, error) {
	key := "load_balancers." + name
	lb, ok := cfg.LoadBalancers[name]
	if !ok {
		return nil, config.Errors{{Key: key, Reason: "no such load balancer"}}
	}
	k, ok := r.kinds[lb.Provider()]
	if !ok {
		return nil, config.Errors{{Key: key + ".provider",
			Reason: fmt.Sprintf("unknown load balancer provider %q (want one of %s)", lb.Provider(), strings.Join(r.Names(), ", "))}}
	}
	kc := k.Config()
	if errs := config.DecodeBlock(key, lb.Settings(), kc); len(errs) > 0 {
		return nil, errs
	}
	if errs := kc.Validate(cfg, key); len(errs) > 0 {
		return nil, errs
	}
	return kc, nil
}

// Check is a config.Check: it reports what Decode finds wrong with every
// load_balancers entry.
func (r *Registry) Check(cfg *config.Config) config.Errors {
	var out config.Errors
	for _, name := range cfg.LoadBalancerNames() {
		if cfg.LoadBalancers[name].Provider() == "" {
			continue // config.Validate already says it is required
		}
		if _, err := r.Decode(cfg, name); err != nil {
			if es, ok := config.AsErrors(err); ok {
				out = append(out, es...)
				continue
			}
			out = append(out, config.FieldError{Key: "load_balancers." + name, Reason: err.Error()})
		}
	}
	return out
}

// New builds the provider of the entry env.Name of the current config.
func (r *Registry) New(ctx context.Context, env Env) (Provider, error) {
	cfg := env.Config()
	kc, err := r.Decode(cfg, env.Name)
	if err != nil {
		return nil, err
	}
	p, err := kc.New(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("load balancer %s (%s): %w", env.Name, cfg.LoadBalancers[env.Name].Provider(), err)
	}
	return p, nil
}

// NewAll builds a provider for every load_balancers entry of the current
// config, by name.
func (r *Registry) NewAll(ctx context.Context, env Env) (map[string]Provider, error) {
	cfg := env.Config()
	out := make(map[string]Provider, len(cfg.LoadBalancers))
	for _, name := range cfg.LoadBalancerNames() {
		e := env
		e.Name = name
		e.Log = env.Log.WithValues("loadBalancer", name)
		p, err := r.New(ctx, e)
		if err != nil {
			return nil, err
		}
		out[name] = p
	}
	return out, nil
}
