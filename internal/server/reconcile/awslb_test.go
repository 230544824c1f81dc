package reconcile_test

import (
	"context"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	elbtypes "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/awslb"
	"github.com/nstance-dev/nstance/internal/server/provider"
	awsprov "github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestLoadBalancerLifecycleAWS runs the reconciler with the EC2 provider
// and the aws load balancer kind on the stateful fakes: members are
// registered with both target groups after their first health report (not
// before); a scale-down deregisters the removed member before its drain is
// announced (held for the target groups' longest delay); a new term, after
// a member was removed from a target group and a stranger of ours added
// behind the leader's back, converges the groups to the members, leaving
// a foreign target alone.
func TestLoadBalancerLifecycleAWS(t *testing.T) {
	ctx := context.Background()
	const (
		arnA = "arn:aws:elasticloadbalancing:us-fake-1:123456789012:targetgroup/www-a/0123456789abcdef"
		arnB = "arn:aws:elasticloadbalancing:us-fake-1:123456789012:targetgroup/www-b/fedcba9876543210"
	)
	cfg := newShardConfig(t).health(10*time.Second, 3, time.Minute).build(t)
	cfg.Shard.Infra.Region = "us-fake-1"
	cfg.LoadBalancers = map[string]config.LoadBalancer{"www": {"provider": "aws", "target_group_arns": []any{arnA, arnB}}}
	tmpl := cfg.Templates["worker"]
	tmpl.LoadBalancers = []string{"www"}
	cfg.Templates["worker"] = tmpl
	require.Empty(t, loadbalancer.NewRegistry(awslb.Kind()).Check(cfg))

	ec2 := fake.New("test-subnet-a")
	elb := fake.NewELB(ec2)
	elb.DrainLooks = 1000 // drained targets stay until the test looks no more
	elb.AddTargetGroup(arnA, elbtypes.TargetTypeEnumInstance, 8080, 20)
	elb.AddTargetGroup(arnB, elbtypes.TargetTypeEnumInstance, 8080, 10)
	o := awsprov.DefaultOptions()
	o.ImageID = "ami-1"
	env := provider.Env{Config: func() *config.Config { return cfg }}
	prov := awsprov.New(ec2, *o, env)
	lb := awslb.New(elb, ec2, awslb.Settings{TargetGroupARNs: []string{arnA, arnB}, TargetType: awslb.TargetInstance},
		loadbalancer.Env{Name: "www", Config: env.Config, Log: logr.Discard()})
	s := newShard(t, cfg, shardOptions{monitor: true, provider: withNonce{prov}, lbs: map[string]loadbalancer.Provider{"www": lb}})
	sub := s.events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	members := func() map[string]loadbalancer.MemberState { return memberStates(t, lb) }

	s.upsert(t, "web", 3, time.Minute)
	ids := s.ids("web")
	require.Len(t, ids, 3)
	require.Empty(t, members(), "nothing is registered before the first health report")
	s.reportAll()
	s.run(t)
	want := map[string]loadbalancer.MemberState{}
	for _, id := range ids {
		want[id] = loadbalancer.MemberActive
	}
	require.Equal(t, want, members())
	require.Len(t, elb.Targets(arnA), 3)
	require.Len(t, elb.Targets(arnB), 3)
	_ = drain(sub.Events())

	// Scale down: deregistered first; the drain waits for the 20s delay.
	s.upsert(t, "web", 2, time.Minute)
	var victim string
	for _, id := range ids {
		if rec, _ := s.insts.Get(id); rec.State == instances.StatePendingDeletion {
			victim = id
		}
	}
	require.NotEmpty(t, victim)
	require.Equal(t, loadbalancer.MemberDraining, members()[victim])
	rec, _ := s.insts.Get(victim)
	require.True(t, rec.DrainHeld)
	for _, ev := range drain(sub.Events()) {
		require.NotEqual(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus(), "no drain before the delay")
	}
	s.advance(t, 19*time.Second)
	rec, _ = s.insts.Get(victim)
	require.True(t, rec.DrainHeld, "held for the longest delay of the target groups (20s)")
	s.advance(t, 2*time.Second)
	rec, _ = s.insts.Get(victim)
	require.False(t, rec.DrainHeld)
	announced := false
	for _, ev := range drain(sub.Events()) {
		announced = announced || (ev.GetInstanceId() == victim && ev.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION)
	}
	require.True(t, announced, "the drain is announced once the delay has passed")
	for range 7 {
		s.reportAll()
		s.advance(t, 10*time.Second)
	}
	_, ok := s.insts.Get(victim)
	require.False(t, ok, "deleted after its drain deadline")

	// Behind the leader's back: a member dropped from one group, a
	// stranger of ours (an instance of this shard no record wants) and a
	// foreign target added.
	s.term.End()
	left := s.ids("web")
	require.Len(t, left, 2)
	ec2IDs := map[string]string{}
	for _, i := range ec2.Instances() {
		for _, tag := range i.Tags {
			if awssdk.ToString(tag.Key) == awsprov.TagInstanceID {
				ec2IDs[awssdk.ToString(tag.Value)] = awssdk.ToString(i.InstanceId)
			}
		}
	}
	elb.Drop(arnB, ec2IDs[left[0]], 8080)
	_, err := prov.Create(ctx, provider.CreateRequest{InstanceID: "web-deadbeef", ProviderID: provider.ID("c1", "s1", "web-deadbeef"),
		Cluster: "c1", Shard: "s1", Tenant: "t", GroupID: "web", Template: "worker", InstanceType: "test.small", AgentNonce: "n"})
	require.NoError(t, err)
	for _, i := range ec2.Instances() {
		for _, tag := range i.Tags {
			if awssdk.ToString(tag.Key) == awsprov.TagInstanceID && awssdk.ToString(tag.Value) == "web-deadbeef" {
				ec2IDs["web-deadbeef"] = awssdk.ToString(i.InstanceId)
			}
		}
	}
	elb.Put(arnA, ec2IDs["web-deadbeef"], 8080)
	elb.Put(arnB, ec2IDs["web-deadbeef"], 8080)
	elb.Put(arnA, "i-0foreign", 8080)
	require.Equal(t, map[string]loadbalancer.MemberState{left[0]: loadbalancer.MemberInactive, left[1]: loadbalancer.MemberActive,
		"web-deadbeef": loadbalancer.MemberActive}, members())

	s.startTerm(t)
	s.reportAll()
	s.run(t)
	got := members()
	require.Equal(t, loadbalancer.MemberActive, got[left[0]], "registered again in the group that lost it")
	require.Equal(t, loadbalancer.MemberActive, got[left[1]])
	require.Equal(t, loadbalancer.MemberDraining, got["web-deadbeef"], "the stranger is deregistered")
	require.Contains(t, elb.Targets(arnA), "i-0foreign:8080=healthy", "the foreign target is untouched")
}
