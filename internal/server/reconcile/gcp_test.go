package reconcile_test

import (
	"context"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/spot"
	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/gcplb"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	gcpfake "github.com/nstance-dev/nstance/internal/server/provider/gcp/fake"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const gcpZone = "europe-west4-a"

// withNonce gives creates the agent nonce the harness does not mint (the
// cloud providers' user data requires one).
type withNonce struct{ provider.Provider }

func (n withNonce) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if req.AgentNonce == "" {
		req.AgentNonce = "nonce-" + req.InstanceID
	}
	return n.Provider.Create(ctx, req)
}

// memberStates is what lb reports of its members, by instance id.
func memberStates(t *testing.T, lb loadbalancer.Provider) map[string]loadbalancer.MemberState {
	t.Helper()
	ms, err := lb.Members(context.Background())
	require.NoError(t, err)
	out := map[string]loadbalancer.MemberState{}
	for _, m := range ms {
		out[m.InstanceID] = m.State
	}
	return out
}

// gcpShard is the harness's reconciler driving the Compute Engine provider
// on the stateful fake.
func gcpShard(t *testing.T, cfg *config.Config, o shardOptions, args map[string]string) (*shard, *gcpfake.Compute, *gcp.Provider) {
	t.Helper()
	cfg.Shard.Infra = config.Infra{Provider: gcp.KindName, Region: "europe-west4", Zone: gcpZone, Options: map[string]any{"project": gcpfake.Project}}
	tmpl := cfg.Templates["worker"]
	tmpl.Args = args
	cfg.Templates["worker"] = tmpl
	kc, err := provider.NewRegistry(gcp.Kind()).Decode(func() *config.Config {
		c := *cfg
		c.Shard.Infra.Options = map[string]any{"project": gcpfake.Project, "image": "projects/debian-cloud/global/images/family/debian-12"}
		return &c
	}())
	require.NoError(t, err)
	gce := gcpfake.New()
	prov := gcp.New(gce, *kc.(*gcp.Options), provider.Env{Config: func() *config.Config { return cfg }})
	o.provider = withNonce{prov}
	return newShard(t, cfg, o), gce, prov
}

// names returns the Compute Engine instances' names, sorted.
func names(gce *gcpfake.Compute) []string {
	var out []string
	for _, i := range gce.Instances() {
		out = append(out, i.GetName())
	}
	sort.Strings(out)
	return out
}

// TestGCPCreateListReplaceDelete: the reconciler creates a group's members
// as Compute Engine instances (labelled and listed as this shard's),
// replaces one the provider reports stopped, and deletes on scale-down.
func TestGCPCreateListReplaceDelete(t *testing.T) {
	ctx := context.Background()
	s, gce, prov := gcpShard(t, newShardConfig(t).build(t), shardOptions{}, nil)
	s.upsert(t, "web", 3, 50*time.Millisecond)
	ids := s.ids("web")
	require.Len(t, ids, 3)
	require.Equal(t, ids, names(gce), "one instance per member, named by its id")
	for _, i := range gce.Instances() {
		require.Equal(t, "c1", i.GetLabels()[gcp.LabelCluster])
		require.Equal(t, "web", i.GetLabels()[gcp.LabelGroup])
		require.Equal(t, "zones/"+gcpZone+"/machineTypes/test.small", i.GetMachineType())
	}
	listed, err := prov.List(ctx)
	require.NoError(t, err)
	require.Len(t, listed, 3)
	require.Len(t, s.running("web"), 3)

	// Compute Engine stops one (a host error, a user in the console).
	victim := ids[1]
	gce.SetStatus(gcpZone, victim, "TERMINATED")
	for step := 0; step < 20; step++ {
		if _, there := s.insts.Get(victim); !there {
			break
		}
		s.advance(t, 100*time.Millisecond)
	}
	_, there := s.insts.Get(victim)
	require.False(t, there, "the stopped member is replaced and retired")
	require.Len(t, s.running("web"), 3)
	require.NotContains(t, names(gce), victim, "and deleted at Compute Engine")
	require.Len(t, gce.Instances(), 3)

	s.upsert(t, "web", 1, 50*time.Millisecond)
	for step := 0; step < 20 && len(gce.Instances()) > 1; step++ {
		s.advance(t, 100*time.Millisecond)
	}
	require.Len(t, gce.Instances(), 1)
	require.Equal(t, s.ids("web"), names(gce))
}

// TestGCPSpotPreemptionIsReplacedFirst: a spot member's metadata server
// says preempted; the agent's watcher (spot.GCP, the real one) reads it and
// reports the notice; the reconciler creates the replacement, which
// reports, before the victim is announced for deletion; then Compute
// Engine reclaims the victim and the shard is whole.
func TestGCPSpotPreemptionIsReplacedFirst(t *testing.T) {
	ctx := context.Background()
	cfg := newShardConfig(t).health(100*time.Millisecond, 3, 2*time.Second).build(t)
	s, gce, _ := gcpShard(t, cfg, shardOptions{monitor: true}, map[string]string{gcp.ArgProvisioningModel: gcp.ProvisioningSpot})
	insts := s.events.Instances.Subscribe("t")
	t.Cleanup(insts.Close)
	s.upsert(t, "web", 2, 50*time.Millisecond)
	s.reportAll()
	s.run(t)
	require.Equal(t, 2, s.ready(t, "web"))
	for _, i := range gce.Instances() {
		require.Equal(t, gcp.ProvisioningSpot, i.GetScheduling().GetProvisioningModel())
	}
	initial := s.ids("web")
	victim := initial[0]

	md := httptest.NewServer(gce.MetadataHandler(gcpZone, victim))
	t.Cleanup(md.Close)
	w := &spot.Watcher{Source: &spot.GCP{Endpoint: md.URL}, Log: logr.Discard()}
	n, err := w.Poll(ctx)
	require.NoError(t, err)
	require.Nil(t, n, "not preempted yet")
	require.NoError(t, gce.Preempt(gcpZone, victim))
	n, err = w.Poll(ctx)
	require.NoError(t, err)
	require.NotNil(t, n)
	s.agents.report(victim, n)
	s.run(t)

	var ev *nstancev1.InstanceEvent
	for step := 0; step < 50 && ev == nil; step++ {
		s.advance(t, 100*time.Millisecond)
		for _, e := range drain(insts.Events()) {
			if e.GetInstanceId() == victim && e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION && ev == nil {
				ev = e
			}
		}
		s.reportAll()
	}
	require.NotNil(t, ev, "the victim was announced")
	require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION, ev.GetReason())
	var fresh []string
	for _, id := range s.ids("web") {
		if id != initial[0] && id != initial[1] {
			fresh = append(fresh, id)
		}
	}
	require.Len(t, fresh, 1, "the replacement exists when the victim is announced")
	_, reported := s.agents.LastReport(fresh[0])
	require.True(t, reported, "and has reported")
	require.Contains(t, names(gce), fresh[0])

	gce.Reclaim(gcpZone, victim)
	for step := 0; step < 20; step++ {
		if _, there := s.insts.Get(victim); !there {
			break
		}
		s.reportAll()
		s.advance(t, 100*time.Millisecond)
	}
	_, there := s.insts.Get(victim)
	require.False(t, there)
	require.Equal(t, 2, s.ready(t, "web"))
	require.ElementsMatch(t, s.ids("web"), names(gce))
}

// TestLoadBalancerLifecycleGCP: members join both unmanaged instance
// groups after their first health report, and a scale-down removes the
// victim from them before its drain is announced.
func TestLoadBalancerLifecycleGCP(t *testing.T) {
	cfg := newShardConfig(t).health(10*time.Second, 3, time.Minute).build(t)
	cfg.LoadBalancers = map[string]config.LoadBalancer{"www": {"provider": "gcp", "instance_groups": []any{"www-a", "www-b"}, "drain_delay": "20s"}}
	tmpl := cfg.Templates["worker"]
	tmpl.LoadBalancers = []string{"www"}
	cfg.Templates["worker"] = tmpl
	gce := gcpfake.New()
	cfg.Shard.Infra = config.Infra{Provider: gcp.KindName, Region: "europe-west4", Zone: gcpZone, Options: map[string]any{"project": gcpfake.Project}}
	kc, err := loadbalancer.NewRegistry(gcplb.Kind()).Decode(cfg, "www")
	require.NoError(t, err)
	lb := gcplb.New(gce, *kc.(*gcplb.Settings), loadbalancer.Env{Name: "www", Config: func() *config.Config { return cfg }, Log: logr.Discard()})
	gce.AddGroup(gcpZone, "www-a")
	gce.AddGroup(gcpZone, "www-b")
	o := gcp.DefaultOptions()
	o.Project, o.Image = gcpfake.Project, "img"
	prov := gcp.New(gce, *o, provider.Env{Config: func() *config.Config { return cfg }})
	s := newShard(t, cfg, shardOptions{monitor: true, provider: withNonce{prov}, lbs: map[string]loadbalancer.Provider{"www": lb}})
	members := func() map[string]loadbalancer.MemberState { return memberStates(t, lb) }
	s.upsert(t, "web", 3, time.Minute)
	ids := s.ids("web")
	require.Empty(t, members(), "nothing joins before the first health report")
	s.reportAll()
	s.run(t)
	want := map[string]loadbalancer.MemberState{}
	for _, id := range ids {
		want[id] = loadbalancer.MemberActive
	}
	require.Equal(t, want, members())
	require.Len(t, gce.GroupMembers(gcpZone, "www-b"), 3)

	s.upsert(t, "web", 2, time.Minute)
	var victim string
	for _, id := range ids {
		if rec, _ := s.insts.Get(id); rec.State == instances.StatePendingDeletion {
			victim = id
		}
	}
	require.NotEmpty(t, victim)
	require.NotContains(t, members(), victim, "removed from the instance groups first")
	rec, _ := s.insts.Get(victim)
	require.True(t, rec.DrainHeld, "the drain waits for drain_delay")
	s.advance(t, 21*time.Second)
	rec, _ = s.insts.Get(victim)
	require.False(t, rec.DrainHeld)
	require.Len(t, gce.GroupMembers(gcpZone, "www-a"), 2)
}
