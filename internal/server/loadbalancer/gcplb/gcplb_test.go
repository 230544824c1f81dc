package gcplb_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/gcplb"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp/fake"
)

const zone = "europe-west4-a"

func testConfig() *config.Config {
	cfg := &config.Config{}
	cfg.Cluster.ID, cfg.Shard.ID = "c1", "s1"
	cfg.Shard.Infra = config.Infra{Provider: "gcp", Region: "europe-west4", Zone: zone, Options: map[string]any{"project": fake.Project}}
	return cfg
}

func launch(t *testing.T, p *gcp.Provider, id string) {
	t.Helper()
	_, err := p.Create(context.Background(), provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "s1", id),
		Cluster: "c1", Shard: "s1", Tenant: "acme", GroupID: "web", Template: "worker", InstanceType: "e2-small", AgentNonce: "n"})
	require.NoError(t, err)
}

func states(t *testing.T, lb *gcplb.Provider) map[string]loadbalancer.MemberState {
	t.Helper()
	ms, err := lb.Members(context.Background())
	require.NoError(t, err)
	out := map[string]loadbalancer.MemberState{}
	for _, m := range ms {
		out[m.InstanceID] = m.State
	}
	return out
}

// run drives one lb through register, a member dropped from one group, a
// foreign member, deregister; api is the fake itself or the real client
// against it.
func run(t *testing.T, gce *fake.Compute, api gcp.API) {
	ctx := context.Background()
	cfg := testConfig()
	env := func() *config.Config { return cfg }
	o := gcp.DefaultOptions()
	o.Project, o.Image = fake.Project, "img"
	prov := gcp.New(api, *o, provider.Env{Config: env})
	gce.AddGroup(zone, "www-a")
	gce.AddGroup(zone, "www-b")
	s := &gcplb.Settings{InstanceGroups: []string{"www-a", "www-b"}, DrainDelay: config.Duration(30 * time.Second)}
	require.Empty(t, s.Validate(cfg, "load_balancers.www"))
	lb := gcplb.New(api, *s, loadbalancer.Env{Name: "www", Config: env, Log: logr.Discard()})

	launch(t, prov, "web-0a1b2c3d")
	launch(t, prov, "web-11111111")
	gce.PutInstance(zone, &computepb.Instance{Name: proto.String("foreign")})
	for _, g := range []string{"www-a", "www-b"} {
		u := fake.InstanceURL(zone, "foreign")
		require.NoError(t, gce.AddInstances(ctx, &computepb.AddInstancesInstanceGroupRequest{Project: fake.Project, Zone: zone, InstanceGroup: g,
			InstanceGroupsAddInstancesRequestResource: &computepb.InstanceGroupsAddInstancesRequest{Instances: []*computepb.InstanceReference{{Instance: &u}}}}))
	}
	require.Empty(t, states(t, lb), "the foreign member is not ours")

	for _, id := range []string{"web-0a1b2c3d", "web-11111111"} {
		require.NoError(t, lb.Register(ctx, loadbalancer.Target{InstanceID: id}))
	}
	require.NoError(t, lb.Register(ctx, loadbalancer.Target{InstanceID: "web-0a1b2c3d"}), "registering again is done")
	require.Equal(t, map[string]loadbalancer.MemberState{"web-0a1b2c3d": loadbalancer.MemberActive, "web-11111111": loadbalancer.MemberActive}, states(t, lb))
	require.Len(t, gce.GroupMembers(zone, "www-a"), 3)

	// Dropped from one group behind our back: inactive; Register mends it.
	u := fake.InstanceURL(zone, "web-11111111")
	require.NoError(t, gce.RemoveInstances(ctx, &computepb.RemoveInstancesInstanceGroupRequest{Project: fake.Project, Zone: zone, InstanceGroup: "www-b",
		InstanceGroupsRemoveInstancesRequestResource: &computepb.InstanceGroupsRemoveInstancesRequest{Instances: []*computepb.InstanceReference{{Instance: &u}}}}))
	require.Equal(t, loadbalancer.MemberInactive, states(t, lb)["web-11111111"])
	require.NoError(t, lb.Register(ctx, loadbalancer.Target{InstanceID: "web-11111111"}))
	require.Equal(t, loadbalancer.MemberActive, states(t, lb)["web-11111111"])

	require.NoError(t, lb.Deregister(ctx, loadbalancer.Target{InstanceID: "web-11111111"}))
	require.NoError(t, lb.Deregister(ctx, loadbalancer.Target{InstanceID: "web-11111111"}), "deregistering again is done")
	require.NoError(t, lb.Remove(ctx, loadbalancer.Target{InstanceID: "web-11111111"}))
	require.Equal(t, map[string]loadbalancer.MemberState{"web-0a1b2c3d": loadbalancer.MemberActive}, states(t, lb))
	require.Equal(t, []string{fake.InstanceURL(zone, "foreign"), fake.InstanceURL(zone, "web-0a1b2c3d")}, gce.GroupMembers(zone, "www-b"),
		"the foreign member stays")
	d, err := lb.DeregistrationDelay(ctx)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, d)
}

func TestLifecycleOnTheFake(t *testing.T) {
	gce := fake.New()
	run(t, gce, gce)
}

func TestLifecycleOverTheWire(t *testing.T) {
	gce := fake.New()
	rest := fake.NewREST(gce)
	srv := httptest.NewServer(rest)
	t.Cleanup(srv.Close)
	c, err := gcp.NewClient(context.Background(), option.WithEndpoint(srv.URL), option.WithoutAuthentication(), option.WithHTTPClient(srv.Client()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	run(t, gce, c)
	require.Empty(t, rest.Problems())
	seen := rest.Seen()
	for _, m := range []string{"instanceGroups.addInstances", "instanceGroups.removeInstances", "instanceGroups.listInstances", "instances.list"} {
		require.Positive(t, seen[m], m)
	}
}

func TestValidate(t *testing.T) {
	cfg := testConfig()
	for _, tc := range []struct {
		name string
		s    gcplb.Settings
		cfg  func(*config.Config)
		keys []string
	}{
		{"ok", gcplb.Settings{InstanceGroups: []string{"www"}}, nil, nil},
		{"none", gcplb.Settings{}, nil, []string{"load_balancers.www.instance_groups"}},
		{"bad name", gcplb.Settings{InstanceGroups: []string{"WWW", "www", "www"}}, nil,
			[]string{"load_balancers.www.instance_groups[0]", "load_balancers.www.instance_groups[2]"}},
		{"no project", gcplb.Settings{InstanceGroups: []string{"www"}}, func(c *config.Config) { c.Shard.Infra.Provider = "aws" },
			[]string{"load_balancers.www.project"}},
		{"no zone", gcplb.Settings{InstanceGroups: []string{"www"}, Project: "p-123456"}, func(c *config.Config) { c.Shard.Infra.Zone = "" },
			[]string{"shard.infra.zone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := *cfg
			c.Shard.Infra = cfg.Shard.Infra
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			var keys []string
			for _, e := range tc.s.Validate(&c, "load_balancers.www") {
				keys = append(keys, e.Key)
			}
			require.Equal(t, tc.keys, keys)
		})
	}
	reg := loadbalancer.NewRegistry(gcplb.Kind())
	cfg.LoadBalancers = map[string]config.LoadBalancer{"www": {"provider": "gcp", "instance_groups": []any{"www-a"}}}
	kc, err := reg.Decode(cfg, "www")
	require.NoError(t, err)
	require.Equal(t, config.Duration(gcplb.DefaultDrainDelay), kc.(*gcplb.Settings).DrainDelay)
}
