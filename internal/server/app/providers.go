package app

import (
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/awslb"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/gcplb"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
)

// DefaultProviders is every provider kind nstance-server ships, for
// shard.infra.provider to choose from (Options.Providers when unset).
func DefaultProviders() *provider.Registry {
	return provider.NewRegistry(tmux.Kind(), process.Kind(), mock.Kind(), aws.Kind(), gcp.Kind(), proxmox.Kind())
}

// DefaultLoadBalancers is every load balancer kind nstance-server ships, for
// load_balancers.<name>.provider to choose from (Options.LoadBalancers when
// unset).
func DefaultLoadBalancers() *loadbalancer.Registry {
	return loadbalancer.NewRegistry(haproxy.Kind(), awslb.Kind(), gcplb.Kind())
}
