// Package gcplb is the gcp load balancer kind: group members become
// members of one or more unmanaged instance groups in the shard's zone,
// which the load balancer's backend services name as backends.
// Registration is instanceGroups.addInstances; deregistration is
// instanceGroups.removeInstances, after which the backend service's
// connection draining lets open connections finish (drain_delay says how
// long the server waits before it drains the instance's node). Remove has
// nothing left to do. A member is ours when the instance behind it carries
// this cluster's and shard's ownership (the gcp provider's labels and
// metadata); every other member of the groups is foreign and never
// touched. The calls are gcp.API's (the server's custom role covers them).
package gcplb

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
)

// Name is the kind's name (load_balancers.<name>.provider).
const Name = "gcp"

// DefaultDrainDelay matches a backend service's default connection
// draining timeout (300s).
const DefaultDrainDelay = 300 * time.Second

// Kind returns the gcp kind for a loadbalancer.Registry.
func Kind() loadbalancer.Kind {
	return loadbalancer.Kind{Name: Name, Config: func() loadbalancer.KindConfig {
		return &Settings{DrainDelay: config.Duration(DefaultDrainDelay)}
	}}
}

// Settings are the keys of one gcp entry besides "provider".
type Settings struct {
	// InstanceGroups are the unmanaged instance groups (names, in the
	// shard's zone) every member joins.
	InstanceGroups []string `json:"instance_groups"`
	// Project of the groups and instances (default: the gcp provider's
	// shard.infra.options.project).
	Project string `json:"project"`
	// DrainDelay is the backend services' connection draining timeout:
	// how long a removed member keeps its connections (default 300s).
	DrainDelay config.Duration `json:"drain_delay"`
	// Endpoint overrides the Compute Engine endpoint.
	Endpoint string `json:"endpoint"`
}

var groupRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// project is the settings' project, else the gcp provider's.
func (s *Settings) project(cfg *config.Config) string {
	if s.Project != "" {
		return s.Project
	}
	if cfg.Shard.Infra.Provider == gcp.KindName {
		if p, ok := cfg.Shard.Infra.Options["project"].(string); ok {
			return p
		}
	}
	return ""
}

// Validate checks the settings; key is the entry's path.
func (s *Settings) Validate(cfg *config.Config, key string) config.Errors {
	var errs config.Errors
	add := func(k, f string, a ...any) {
		errs = append(errs, config.FieldError{Key: key + k, Reason: fmt.Sprintf(f, a...)})
	}
	if len(s.InstanceGroups) == 0 {
		add(".instance_groups", "must list at least one unmanaged instance group")
	}
	seen := map[string]bool{}
	for i, g := range s.InstanceGroups {
		if !groupRE.MatchString(g) {
			add(fmt.Sprintf(".instance_groups[%d]", i), "want an instance group name (RFC 1035 label), got %q", g)
		}
		if seen[g] {
			add(fmt.Sprintf(".instance_groups[%d]", i), "listed twice")
		}
		seen[g] = true
	}
	if s.project(cfg) == "" {
		add(".project", "required unless shard.infra.provider is gcp with options.project")
	}
	if s.DrainDelay < 0 {
		add(".drain_delay", "must not be negative, got %s", s.DrainDelay.D())
	}
	if cfg.Shard.Infra.Zone == "" {
		errs = append(errs, config.FieldError{Key: "shard.infra.zone", Reason: "required by the gcp load balancer " + strings.TrimPrefix(key, "load_balancers.")})
	}
	return errs
}

// New builds the entry's provider on the Compute Engine REST clients.
func (s *Settings) New(ctx context.Context, env loadbalancer.Env) (loadbalancer.Provider, error) {
	var opts []option.ClientOption
	if s.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(s.Endpoint))
	}
	client, err := gcp.NewClient(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return New(client, *s, env), nil
}

// Provider drives one entry's instance groups. Safe for concurrent use.
type Provider struct {
	api gcp.API
	s   Settings
	env loadbalancer.Env
}

var _ loadbalancer.Provider = (*Provider)(nil)

// New returns a provider calling api; s must be validated.
func New(api gcp.API, s Settings, env loadbalancer.Env) *Provider {
	return &Provider{api: api, s: s, env: env}
}

func (p *Provider) where() (project, zone string) {
	cfg := p.env.Config()
	return p.s.project(cfg), cfg.Shard.Infra.Zone
}

func (p *Provider) url(name string) string {
	project, zone := p.where()
	return fmt.Sprintf("projects/%s/zones/%s/instances/%s", project, zone, name)
}

// members returns the instance names in group.
func (p *Provider) members(ctx context.Context, group string) (map[string]bool, error) {
	project, zone := p.where()
	list, err := p.api.ListGroupInstances(ctx, &computepb.ListInstancesInstanceGroupsRequest{Project: project, Zone: zone, InstanceGroup: group})
	if err != nil {
		return nil, fmt.Errorf("instanceGroups.listInstances %s: %w", group, err)
	}
	out := map[string]bool{}
	for _, m := range list {
		if z, n, ok := gcp.ParseInstanceURL(m.GetInstance()); ok && z == zone {
			out[n] = true
		}
	}
	return out, nil
}

func refs(url string) []*computepb.InstanceReference {
	return []*computepb.InstanceReference{{Instance: proto.String(url)}}
}

// Register adds the instance to every group that lacks it.
func (p *Provider) Register(ctx context.Context, t loadbalancer.Target) error {
	project, zone := p.where()
	name := gcp.InstanceName(t.InstanceID)
	for _, g := range p.s.InstanceGroups {
		in, err := p.members(ctx, g)
		if err != nil {
			return err
		}
		if in[name] {
			continue
		}
		err = p.api.AddInstances(ctx, &computepb.AddInstancesInstanceGroupRequest{Project: project, Zone: zone, InstanceGroup: g,
			InstanceGroupsAddInstancesRequestResource: &computepb.InstanceGroupsAddInstancesRequest{Instances: refs(p.url(name))}})
		if err != nil {
			return fmt.Errorf("instanceGroups.addInstances %s %s: %w", g, name, err)
		}
	}
	return nil
}

// Deregister removes the instance from every group that has it; the
// backend services drain its connections.
func (p *Provider) Deregister(ctx context.Context, t loadbalancer.Target) error {
	project, zone := p.where()
	name := gcp.InstanceName(t.InstanceID)
	for _, g := range p.s.InstanceGroups {
		in, err := p.members(ctx, g)
		if err != nil {
			return err
		}
		if !in[name] {
			continue
		}
		err = p.api.RemoveInstances(ctx, &computepb.RemoveInstancesInstanceGroupRequest{Project: project, Zone: zone, InstanceGroup: g,
			InstanceGroupsRemoveInstancesRequestResource: &computepb.InstanceGroupsRemoveInstancesRequest{Instances: refs(p.url(name))}})
		if err != nil && !gcp.NotFound(err) {
			return fmt.Errorf("instanceGroups.removeInstances %s %s: %w", g, name, err)
		}
	}
	return nil
}

// Remove has nothing to do: the groups dropped the instance at Deregister.
func (p *Provider) Remove(context.Context, loadbalancer.Target) error { return nil }

// Members lists this shard's instances in the groups: active when in
// every group, inactive when only in some. Removed members are gone (the
// groups keep no draining state).
func (p *Provider) Members(ctx context.Context) ([]loadbalancer.Member, error) {
	project, zone := p.where()
	cfg := p.env.Config()
	ours, err := gcp.ListOwned(ctx, p.api, project, zone, cfg.Cluster.ID, cfg.Shard.ID)
	if err != nil {
		return nil, err
	}
	ids := map[string]string{} // name -> instance id
	for _, i := range ours {
		ids[i.GetName()] = gcp.Meta(i, gcp.MetaInstanceID)
	}
	count := map[string]int{}
	for _, g := range p.s.InstanceGroups {
		in, err := p.members(ctx, g)
		if err != nil {
			return nil, err
		}
		for n := range in {
			if _, ok := ids[n]; ok {
				count[n]++
			}
		}
	}
	out := make([]loadbalancer.Member, 0, len(count))
	for n, c := range count {
		m := loadbalancer.Member{InstanceID: ids[n], State: loadbalancer.MemberActive,
			Detail: fmt.Sprintf("in %d of %d instance groups", c, len(p.s.InstanceGroups))}
		if c < len(p.s.InstanceGroups) {
			m.State = loadbalancer.MemberInactive
		}
		out = append(out, m)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].InstanceID < out[b].InstanceID })
	return out, nil
}

// DeregistrationDelay is the configured drain_delay.
func (p *Provider) DeregistrationDelay(context.Context) (time.Duration, error) {
	return p.s.DrainDelay.D(), nil
}
