package awslb_test

import (
	"context"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	elbtypes "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/awslb"
	"github.com/nstance-dev/nstance/internal/server/provider"
	awsprov "github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
)

const (
	arnA = "arn:aws:elasticloadbalancing:us-fake-1:123456789012:targetgroup/www-a/0123456789abcdef"
	arnB = "arn:aws:elasticloadbalancing:us-fake-1:123456789012:targetgroup/www-b/fedcba9876543210"
)

func testConfig() *config.Config {
	cfg := &config.Config{}
	cfg.Cluster.ID, cfg.Shard.ID = "c1", "s1"
	cfg.Shard.Infra = config.Infra{Provider: "aws", Region: "us-fake-1", Zone: fake.Zone}
	return cfg
}

type fleet struct {
	ec2  *fake.EC2
	elb  *fake.ELB
	prov *awsprov.Provider
	cfg  *config.Config
}

func newFleet(t *testing.T) *fleet {
	f := fake.New()
	o := awsprov.DefaultOptions()
	o.ImageID = "ami-1"
	cfg := testConfig()
	return &fleet{ec2: f, elb: fake.NewELB(f), cfg: cfg, prov: awsprov.New(f, *o, provider.Env{Config: func() *config.Config { return cfg }})}
}

// launch creates an instance of this shard; it returns its EC2 id and address.
func (fl *fleet) launch(t *testing.T, id string) (string, string) {
	t.Helper()
	inst, err := fl.prov.Create(context.Background(), provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "s1", id),
		Cluster: "c1", Shard: "s1", Tenant: "acme", GroupID: "web", Template: "worker", InstanceType: "m7g.large", AgentNonce: "n"})
	require.NoError(t, err)
	for _, i := range fl.ec2.Instances() {
		for _, tag := range i.Tags {
			if awssdk.ToString(tag.Key) == awsprov.TagInstanceID && awssdk.ToString(tag.Value) == id {
				return awssdk.ToString(i.InstanceId), inst.Addresses[0]
			}
		}
	}
	t.Fatalf("no EC2 instance for %s", id)
	return "", ""
}

// foreign launches an instance of another cluster: its targets are not ours.
func (fl *fleet) foreign(t *testing.T) (string, string) {
	t.Helper()
	out, err := fl.ec2.RunInstances(context.Background(), &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstance, Tags: []ec2types.Tag{
			{Key: awssdk.String(awsprov.TagCluster), Value: awssdk.String("other")}, {Key: awssdk.String(awsprov.TagShard), Value: awssdk.String("s1")},
			{Key: awssdk.String(awsprov.TagInstanceID), Value: awssdk.String("web-foreign1")}}}}})
	require.NoError(t, err)
	_, err = fl.ec2.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{}) // pending → running
	require.NoError(t, err)
	return awssdk.ToString(out.Instances[0].InstanceId), awssdk.ToString(out.Instances[0].PrivateIpAddress)
}

func members(t *testing.T, p loadbalancer.Provider) map[string]loadbalancer.MemberState {
	t.Helper()
	ms, err := p.Members(context.Background())
	require.NoError(t, err)
	out := map[string]loadbalancer.MemberState{}
	for _, m := range ms {
		out[m.InstanceID] = m.State
	}
	return out
}

// TestInstanceTargets: two target groups of instance targets. Members are
// registered with both, told from foreign targets by the ownership tags,
// drained on deregistration; the delay is the longest of the groups'
// attribute. A leadership start's Reconcile over Members finds a target
// removed behind the server's back (lost) and one of ours no instance
// wants (a stranger), and the calls it leads to converge the groups.
func TestInstanceTargets(t *testing.T) {
	ctx := context.Background()
	fl := newFleet(t)
	fl.elb.AddTargetGroup(arnA, elbtypes.TargetTypeEnumInstance, 8080, 30)
	fl.elb.AddTargetGroup(arnB, elbtypes.TargetTypeEnumInstance, 8080, 90)
	fl.elb.DrainLooks = 1
	s := awslb.Settings{TargetGroupARNs: []string{arnA, arnB}, TargetType: awslb.TargetInstance}
	p := awslb.New(fl.elb, fl.ec2, s, loadbalancer.Env{Name: "www", Config: func() *config.Config { return fl.cfg }, Log: logr.Discard()})

	ec1, _ := fl.launch(t, "web-00000001")
	ec2ID, _ := fl.launch(t, "web-00000002")
	ec3, _ := fl.launch(t, "web-00000003")
	foreign, _ := fl.foreign(t)
	fl.elb.Put(arnA, foreign, 8080)

	require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000001"}))
	require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000001"}), "idempotent")
	require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000002"}))
	require.ElementsMatch(t, []string{ec1 + ":8080=healthy", ec2ID + ":8080=healthy", foreign + ":8080=healthy"}, fl.elb.Targets(arnA))
	require.Len(t, fl.elb.Targets(arnB), 2)
	require.Equal(t, map[string]loadbalancer.MemberState{"web-00000001": loadbalancer.MemberActive, "web-00000002": loadbalancer.MemberActive}, members(t, p),
		"the foreign target is left out")

	d, err := p.DeregistrationDelay(ctx)
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, d, "the longest of the target groups'")
	_, err = p.DeregistrationDelay(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, fl.elb.Calls(fake.OpDescribeTargetGroupAttributes), "cached")

	// Deregistration drains in both groups, then ELBv2 drops the target.
	require.NoError(t, p.Deregister(ctx, loadbalancer.Target{InstanceID: "web-00000002"}))
	require.Equal(t, loadbalancer.MemberDraining, members(t, p)["web-00000002"])
	require.NoError(t, p.Remove(ctx, loadbalancer.Target{InstanceID: "web-00000002"}))
	require.NotContains(t, members(t, p), "web-00000002")
	require.NoError(t, p.Deregister(ctx, loadbalancer.Target{InstanceID: "web-00000002"}), "deregistering a target that is gone is done")

	// Behind the server's back: web-1 dropped from one group, web-3 (ours,
	// not wanted there) put into both.
	fl.elb.Drop(arnB, ec1, 8080)
	fl.elb.Put(arnA, ec3, 8080)
	fl.elb.Put(arnB, ec3, 8080)
	got, err := p.Members(ctx)
	require.NoError(t, err)
	reg := time.Unix(1, 0)
	m := loadbalancer.Reconcile(got, map[string]loadbalancer.Record{
		"web-00000001": {Wanted: true, State: loadbalancer.TargetState{Registered: &reg}},
	})
	require.Equal(t, loadbalancer.Membership{Strangers: []string{"web-00000003"}, Lost: []string{"web-00000001"}}, m)
	// What the reconciler then does: strangers out by id alone, the lost registered again.
	for _, id := range m.Strangers {
		require.NoError(t, p.Deregister(ctx, loadbalancer.Target{InstanceID: id}))
		require.NoError(t, p.Remove(ctx, loadbalancer.Target{InstanceID: id}))
	}
	for _, id := range m.Lost {
		require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: id}))
	}
	_, _ = p.Members(ctx) // one look: the strangers' drain ends
	require.Equal(t, map[string]loadbalancer.MemberState{"web-00000001": loadbalancer.MemberActive}, members(t, p))
	require.ElementsMatch(t, []string{ec1 + ":8080=healthy", foreign + ":8080=healthy"}, fl.elb.Targets(arnA), "the foreign target untouched")

	// An instance that is gone cannot be registered.
	require.ErrorContains(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-0000dead"}), "no live EC2 instance")
}

// TestIPTargets: ip targets are the instance's address (from the target or
// looked up), on the entry's port; members matched by private address.
func TestIPTargets(t *testing.T) {
	ctx := context.Background()
	fl := newFleet(t)
	fl.elb.AddTargetGroup(arnA, elbtypes.TargetTypeEnumIp, 80, 0)
	fl.elb.DrainLooks = 1
	s := awslb.Settings{TargetGroupARNs: []string{arnA}, TargetType: awslb.TargetIP, Port: 9000}
	p := awslb.New(fl.elb, fl.ec2, s, loadbalancer.Env{Name: "www", Config: func() *config.Config { return fl.cfg }, Log: logr.Discard()})
	_, ip1 := fl.launch(t, "web-00000001")
	_, ip2 := fl.launch(t, "web-00000002")
	_, fip := fl.foreign(t)
	fl.elb.Put(arnA, fip, 9000)

	require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000001", Addresses: []string{"2600:1f18::1", ip1}}))
	require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000002"}), "address looked up by the ownership tags")
	require.ElementsMatch(t, []string{ip1 + ":9000=healthy", ip2 + ":9000=healthy", fip + ":9000=healthy"}, fl.elb.Targets(arnA))
	require.Equal(t, map[string]loadbalancer.MemberState{"web-00000001": loadbalancer.MemberActive, "web-00000002": loadbalancer.MemberActive}, members(t, p))
	d, err := p.DeregistrationDelay(ctx)
	require.NoError(t, err)
	require.Zero(t, d)
	require.NoError(t, p.Deregister(ctx, loadbalancer.Target{InstanceID: "web-00000002"}))
	require.Equal(t, loadbalancer.MemberDraining, members(t, p)["web-00000002"])
}

func TestValidate(t *testing.T) {
	reg := loadbalancer.NewRegistry(awslb.Kind())
	cfg := testConfig()
	cfg.Shard.Infra.Region = ""
	cfg.LoadBalancers = map[string]config.LoadBalancer{
		"www": {"provider": "aws", "target_group_arns": []any{"tg-1", arnA, arnA}, "target_type": "ip"},
		"ok":  {"provider": "aws", "target_group_arns": []any{arnB}},
		"bad": {"provider": "aws", "target_type": "lambda", "port": 70000.0},
	}
	var got []string
	for _, e := range reg.Check(cfg) {
		got = append(got, e.Error())
	}
	require.ElementsMatch(t, []string{
		"load_balancers.bad.target_group_arns: must list at least one target group ARN",
		`load_balancers.bad.target_type: want "instance" or "ip", got "lambda"`,
		"load_balancers.bad.port: want 1-65535, got 70000",
		"shard.infra.region: required by the aws load balancer bad",
		"shard.infra.region: required by the aws load balancer ok",
		"shard.infra.region: required by the aws load balancer www",
		`load_balancers.www.target_group_arns[0]: want an ELBv2 target group ARN (arn:…:targetgroup/…), got "tg-1"`,
		"load_balancers.www.target_group_arns[2]: listed twice",
		"load_balancers.www.port: required for ip targets",
	}, got)
	cfg.Shard.Infra.Region = "us-fake-1"
	delete(cfg.LoadBalancers, "bad")
	delete(cfg.LoadBalancers, "www")
	require.Empty(t, reg.Check(cfg))
}
