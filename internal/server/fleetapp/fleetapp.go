package fleetapp

import (
	"context"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/fleet"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/operatorapi"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Built is what Factory produced, kept for the app's leadership hook.
type Built struct {
	Fleet  *fleet.Fleet
	Config *liveconfig.Holder
}

// Lead runs the reconciler until ctx (the leadership term) ends.
func (b *Built) Lead(ctx context.Context) error { return b.Fleet.Run(ctx) }

// Options tune the factory.
type Options struct {
	Local fleet.LocalOptions
	// OnBuilt receives the assembled fleet (the app calls Lead per term).
	OnBuilt func(*Built)
	// ResyncInterval of the reconciler (default 30s).
	ResyncInterval time.Duration
	// Agent tunes the Agent service and health monitoring; the workload CA,
	// server hosts, certificate validity and Monitor are filled in from the
	// runtime.
	Agent fleet.AgentOptions
}

// Factory returns a ServiceFactory serving the full Operator API.
func Factory(o Options) app.ServiceFactory {
	return func(rt *app.Runtime) (app.Services, error) {
		cfg := rt.Config
		var mod time.Time
		if rt.App != nil {
			_, mod = rt.App.ConfigVersion()
		}
		holder := liveconfig.New(rt.Store, rt.Keys.Config(cfg.Shard.ID), cfg, rt.ConfigETag, mod)
		local := o.Local
		if d := cfg.Shard.HealthCheckInterval.D(); d > 0 {
			// Local agents report at the interval the server expects.
			local.Env = append(append([]string{}, local.Env...), "NSTANCE_METRICS_INTERVAL="+d.String())
		}
		prov, err := fleet.NewProvider(cfg.Shard.Infra, local)
		if err != nil {
			return app.Services{}, err
		}
		if rt.Metrics != nil {
			prov = provider.Instrumented(prov, rt.Metrics.Provider())
		}
		if rt.Fence != nil {
			// A server whose shard lease has lapsed creates, deletes and
			// attaches nothing, even from work that has not noticed yet.
			prov = provider.Fenced(prov, rt.Fence)
		}
		core := &operatorapi.Core{Shard: cfg.Shard.ID, Config: holder, Issuer: rt.Issuer}
		core.Operators, core.Log = &operatorapi.OperatorRecords{Store: rt.Store, Keys: rt.Keys}, rt.Log.WithName("operator")
		opts := fleet.Options{
			Store: rt.Store, Keys: rt.Keys, Config: holder, Provider: prov,
			Nonces: reconcile.KeyMinter{Key: rt.NonceKey, ClusterID: cfg.Cluster.ID, Shard: cfg.Shard.ID, TTL: cfg.Certificates.AgentNonceTTL.D()},
			CACert: func(context.Context) ([]byte, error) {
				if rt.Trust != nil {
					// Every trusted CA: both while the cluster CA rotates.
					return rt.Trust.BundlePEM(), nil
				}
				if rt.CA == nil {
					return nil, fmt.Errorf("cluster CA not loaded")
				}
				return rt.CA.CertPEM, nil
			},
			RegistrationAddr: cfg.Shard.Advertise.RegistrationAddr, AgentAddr: cfg.Shard.Advertise.AgentAddr,
			Renewer: core, Log: rt.Log, ResyncInterval: o.ResyncInterval, Agent: o.Agent, Revocations: rt.Revocations,
		}
		if rt.App != nil {
			opts.Leadership = rt.App.Leadership
		}
		opts.Agent.WorkloadCA = rt.WorkloadCA
		if rt.Issuer != nil && opts.Agent.RenewIdentity == nil {
			opts.Agent.RenewIdentity = rt.Issuer.RenewAgentPEM
		}
		opts.Agent.ServerHosts = append(append([]string{}, opts.Agent.ServerHosts...), rt.ServerHosts...)
		if opts.Agent.CertValidity <= 0 {
			opts.Agent.CertValidity = cfg.Certificates.AgentValidity.D()
		}
		// The mock provider runs no agents, so there is nothing to monitor.
		opts.Agent.Monitor = cfg.Shard.Infra.Provider != "mock"
		if rt.Cache != nil {
			opts.Mirror = CacheMirror{Cache: rt.Cache, Prefix: rt.Keys.InstancePrefix(cfg.Shard.ID)}
		}
		if rt.Metrics != nil {
			opts.QueueMetrics = rt.Metrics.QueueMetrics()
		}
		f, err := fleet.New(opts)
		if err != nil {
			return app.Services{}, err
		}
		if rt.Metrics != nil {
			rt.Metrics.SetFleet(FleetMetrics(f))
		}
		if o.OnBuilt != nil {
			o.OnBuilt(&Built{Fleet: f, Config: holder})
		}
		svcs := app.Services{Operator: f.Service, Agent: &nstancev1.UnimplementedAgentServiceServer{}, Lead: f.Run, AgentGate: f.Gate}
		if f.Agent != nil {
			svcs.Agent = f.Agent
		}
		return svcs, nil
	}
}

// CacheMirror keeps the app cache's "instance" kind in step with the store.
type CacheMirror struct {
	Cache  *cache.Cache
	Prefix string
}

var _ instances.Mirror = CacheMirror{}

// Reset implements instances.Mirror.
func (m CacheMirror) Reset(ctx context.Context, objs []instances.MirrorObject) error {
	have, err := m.Cache.List(ctx, app.KindInstance)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, o := range objs {
		keep[o.Key] = true
		if err := m.Put(ctx, o); err != nil {
			return err
		}
	}
	for _, e := range have {
		if !keep[e.Key] {
			if err := m.Cache.Delete(ctx, app.KindInstance, e.Key); err != nil {
				return err
			}
		}
	}
	return nil
}

// Put implements instances.Mirror.
func (m CacheMirror) Put(ctx context.Context, o instances.MirrorObject) error {
	return m.Cache.Put(ctx, cache.Entry{Kind: app.KindInstance, Key: o.Key, ETag: o.ETag, LastModified: time.Now(), Body: o.Body})
}

// Delete implements instances.Mirror.
func (m CacheMirror) Delete(ctx context.Context, key string) error {
	return m.Cache.Delete(ctx, app.KindInstance, key)
}
