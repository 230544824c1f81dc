package aws_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
)

const caPEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"

func testConfig() *config.Config {
	cfg := &config.Config{}
	cfg.Cluster.ID, cfg.Shard.ID = "c1", "s1"
	cfg.Shard.Infra = config.Infra{Provider: "aws", Region: "us-fake-1", Zone: fake.Zone}
	cfg.Shard.SubnetPools = map[string]config.SubnetPool{
		"default": {Subnets: []string{"subnet-a", "subnet-b"}},
		"other":   {Subnets: []string{"subnet-c"}},
	}
	return cfg
}

type harness struct {
	ec2  *fake.EC2
	p    *aws.Provider
	cfg  *config.Config
	opts *aws.Options
}

func newHarness(t *testing.T, mutate func(*aws.Options)) *harness {
	t.Helper()
	h := &harness{ec2: fake.New("subnet-a", "subnet-b", "subnet-c"), cfg: testConfig()}
	o := aws.DefaultOptions()
	o.ImageID = "ami-0123456789abcdef0"
	o.SecurityGroupIDs = []string{"sg-1"}
	o.Tags = map[string]string{"team": "infra"}
	o.VisibilityTimeout = config.Duration(2 * time.Second)
	if mutate != nil {
		mutate(o)
	}
	require.Empty(t, o.Validate(h.cfg))
	h.opts = o
	h.p = aws.New(h.ec2, *o, provider.Env{Config: func() *config.Config { return h.cfg },
		Local: provider.Local{Env: []string{"NSTANCE_METRICS_INTERVAL=5s"}}})
	h.p.Visible = wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Steps: 10, Cap: 20 * time.Millisecond}
	return h
}

func request(id, group string) provider.CreateRequest {
	return provider.CreateRequest{
		InstanceID: id, ProviderID: provider.ID("c1", "s1", id), Cluster: "c1", Shard: "s1", Tenant: "acme",
		GroupID: group, Template: "worker", InstanceType: "m7g.large", SubnetPool: "default",
		AgentNonce: "nonce-" + id, CACertPEM: []byte(caPEM),
		RegistrationAddr: "10.0.0.5:8992", AgentAddr: "10.0.0.5:8994",
	}
}

func tagMap(tags []types.Tag) map[string]string {
	m := map[string]string{}
	for _, t := range tags {
		m[*t.Key] = *t.Value
	}
	return m
}

func TestCreateListStatusDelete(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	for _, id := range []string{"web-00000002", "web-00000001", "db-00000001"} {
		inst, err := h.p.Create(ctx, request(id, strings.Split(id, "-")[0]))
		require.NoError(t, err)
		require.Equal(t, id, inst.InstanceID)
		require.Equal(t, provider.ID("c1", "s1", id), inst.ProviderID)
		require.Contains(t, []provider.State{provider.StatePending, provider.StateRunning}, inst.State)
		require.NotEmpty(t, inst.Addresses)
	}
	insts := h.ec2.Instances()
	require.Len(t, insts, 3)
	first := insts[0]
	require.Equal(t, map[string]string{
		"Name": "web-00000002", "team": "infra", aws.TagCluster: "c1", aws.TagShard: "s1", aws.TagTenant: "acme",
		aws.TagGroup: "web", aws.TagTemplate: "worker", aws.TagInstanceID: "web-00000002", aws.TagProviderID: "nstance://c1/s1/web-00000002",
	}, tagMap(first.Tags))
	require.Contains(t, []string{"subnet-a", "subnet-b"}, *first.SubnetId)
	require.Equal(t, types.InstanceType("m7g.large"), first.InstanceType)
	require.Equal(t, "ami-0123456789abcdef0", *first.ImageId)
	require.Contains(t, string(first.UserData), "#!/bin/sh")

	in := h.ec2.RunInputs()[0]
	require.Equal(t, "web-00000002", awssdk.ToString(in.ClientToken), "the instance id is the client token")
	require.Equal(t, types.HttpTokensStateRequired, in.MetadataOptions.HttpTokens, "IMDSv2 only")
	require.Equal(t, int32(1), awssdk.ToInt32(in.MetadataOptions.HttpPutResponseHopLimit), "one hop: pods get no IMDS token")
	require.Equal(t, []string{"sg-1"}, in.SecurityGroupIds)
	require.Nil(t, in.InstanceMarketOptions, "on-demand by default")
	require.Len(t, in.TagSpecifications, 2, "instance and volumes are tagged")

	st, err := h.p.Status(ctx, "web-00000001")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State)
	require.Equal(t, "nstance://c1/s1/web-00000001", st.ProviderID)

	list, err := h.p.List(ctx)
	require.NoError(t, err)
	var ids []string
	for _, i := range list {
		ids = append(ids, i.InstanceID)
	}
	require.Equal(t, []string{"db-00000001", "web-00000001", "web-00000002"}, ids)

	require.NoError(t, h.p.Delete(ctx, "web-00000001"))
	_, err = h.p.Status(ctx, "web-00000001")
	require.ErrorIs(t, err, provider.ErrNotFound)
	list, err = h.p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.NoError(t, h.p.Delete(ctx, "web-00000001"), "deleting a deleted instance is no error")
	require.NoError(t, h.p.Delete(ctx, "never-existed"))
	require.Equal(t, 1, h.ec2.Calls(fake.OpTerminateInstances))
}

func TestListIsScopedToClusterAndShardAndPages(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.ec2.PageSize = 2
	for _, id := range []string{"a-1", "a-2", "a-3", "a-4", "a-5"} {
		_, err := h.p.Create(ctx, request(id, "a"))
		require.NoError(t, err)
	}
	// Another shard's provider on the same account: its instances are not ours.
	other := testConfig()
	other.Shard.ID = "s2"
	o := aws.DefaultOptions()
	o.ImageID = "ami-1"
	p2 := aws.New(h.ec2, *o, provider.Env{Config: func() *config.Config { return other }})
	p2.Visible = h.p.Visible
	req := request("b-1", "b")
	req.Shard, req.ProviderID = "s2", provider.ID("c1", "s2", "b-1")
	_, err := p2.Create(ctx, req)
	require.NoError(t, err)

	calls := h.ec2.Calls(fake.OpDescribeInstances)
	list, err := h.p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 5)
	require.Equal(t, 3, h.ec2.Calls(fake.OpDescribeInstances)-calls, "5 instances in pages of 2")
	list2, err := p2.List(ctx)
	require.NoError(t, err)
	require.Len(t, list2, 1)
	require.Equal(t, "b-1", list2[0].InstanceID)
	_, err = h.p.Status(ctx, "b-1")
	require.ErrorIs(t, err, provider.ErrNotFound, "another shard's instance")
	require.NoError(t, h.p.Delete(ctx, "b-1"))
	_, err = p2.Status(ctx, "b-1")
	require.NoError(t, err, "deleting through another shard terminates nothing")
}

func TestCreateIsIdempotent(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	a, err := h.p.Create(ctx, request("web-1", "web"))
	require.NoError(t, err)
	b, err := h.p.Create(ctx, request("web-1", "web"))
	require.NoError(t, err)
	require.Equal(t, a.InstanceID, b.InstanceID)
	require.Len(t, h.ec2.Instances(), 1, "same client token, same instance")

	// EC2 launched the instance but the answer was lost: the retry gets it.
	h.ec2.LoseResponses(fake.OpRunInstances, 1)
	_, err = h.p.Create(ctx, request("web-2", "web"))
	require.Error(t, err)
	require.Len(t, h.ec2.Instances(), 2)
	c, err := h.p.Create(ctx, request("web-2", "web"))
	require.NoError(t, err)
	require.Equal(t, "web-2", c.InstanceID)
	require.Len(t, h.ec2.Instances(), 2)

	// A new leader (new provider, nothing remembered) repeating a create
	// after the subnet pool changed: EC2 refuses the token with other
	// parameters, and the provider returns the instance the token launched.
	h.cfg.Shard.SubnetPools["default"] = config.SubnetPool{Subnets: []string{"subnet-c"}}
	o := aws.DefaultOptions()
	o.ImageID, o.SecurityGroupIDs, o.Tags = "ami-0123456789abcdef0", []string{"sg-1"}, map[string]string{"team": "infra"}
	fresh := aws.New(h.ec2, *o, provider.Env{Config: func() *config.Config { return h.cfg }})
	d, err := fresh.Create(ctx, request("web-1", "web"))
	require.NoError(t, err)
	require.Equal(t, "web-1", d.InstanceID)
	require.Len(t, h.ec2.Instances(), 2)
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func TestThrottling(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)

	// RunInstances throttled twice: each create fails with the EC2 code
	// (behind the real client the SDK retryer absorbs this, see the wire
	// test); the reconciler's next attempts converge on one instance.
	h.ec2.Throttle(fake.OpRunInstances, 2)
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if _, err = h.p.Create(ctx, request("web-1", "web")); err == nil {
			break
		}
		require.Equal(t, "RequestLimitExceeded", apiCode(err))
	}
	require.NoError(t, err)
	require.Equal(t, 3, h.ec2.Calls(fake.OpRunInstances))
	require.Len(t, h.ec2.Instances(), 1)

	// Throttled describes while waiting for the new instance to show are
	// waited out inside the create.
	h.ec2.Throttle(fake.OpDescribeInstances, 3)
	_, err = h.p.Create(ctx, request("web-2", "web"))
	require.NoError(t, err)
	require.Len(t, h.ec2.Instances(), 2)

	h.ec2.Throttle(fake.OpDescribeInstances, 1)
	_, err = h.p.List(ctx)
	require.Equal(t, "RequestLimitExceeded", apiCode(err), "a throttled listing is an error, not an empty list")
	h.ec2.Throttle(fake.OpTerminateInstances, 1)
	require.Error(t, h.p.Delete(ctx, "web-1"))
	require.NoError(t, h.p.Delete(ctx, "web-1"))
}

func TestEventualConsistency(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.ec2.VisibleAfter = 4
	before := h.ec2.Calls(fake.OpDescribeInstances)
	inst, err := h.p.Create(ctx, request("web-1", "web"))
	require.NoError(t, err, "the create waits for the instance to show")
	require.Equal(t, "web-1", inst.InstanceID)
	require.GreaterOrEqual(t, h.ec2.Calls(fake.OpDescribeInstances)-before, 5)

	// Never visible within the timeout: the create fails, and the next
	// create (same id) finds the instance once EC2 shows it.
	h.ec2.VisibleAfter = 1000
	_, err = h.p.Create(ctx, request("web-2", "web"))
	require.ErrorContains(t, err, "not visible")
	require.ErrorContains(t, err, "InvalidInstanceID.NotFound")
	require.Len(t, h.ec2.Instances(), 2, "launched all the same")
	h.ec2.ShowAll()
	inst, err = h.p.Create(ctx, request("web-2", "web"))
	require.NoError(t, err)
	require.Equal(t, "web-2", inst.InstanceID)
	require.Len(t, h.ec2.Instances(), 2)
}

func TestSpot(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	req := request("spot-1", "spot")
	req.Args = map[string]string{aws.ArgMarket: aws.MarketSpot, aws.ArgSpotMaxPrice: "0.05"}
	inst, err := h.p.Create(ctx, req)
	require.NoError(t, err)
	require.Contains(t, inst.Message, "spot")
	in := h.ec2.RunInputs()[0]
	require.Equal(t, types.MarketTypeSpot, in.InstanceMarketOptions.MarketType)
	require.Equal(t, "0.05", *in.InstanceMarketOptions.SpotOptions.MaxPrice)
	require.Equal(t, types.InstanceInterruptionBehaviorTerminate, in.InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior)

	od, err := h.p.Create(ctx, request("od-1", "od"))
	require.NoError(t, err)
	require.NotContains(t, od.Message, "spot")

	// EC2 reclaims the spot instance: it is gone for the server, which
	// replaces it; the on-demand one is untouched.
	require.NoError(t, h.ec2.Interrupt(*h.ec2.Instances()[0].InstanceId))
	_, err = h.p.Status(ctx, "spot-1")
	require.ErrorIs(t, err, provider.ErrNotFound)
	list, err := h.p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "od-1", list[0].InstanceID)

	// The whole shard can default to spot.
	h2 := newHarness(t, func(o *aws.Options) { o.Market = aws.MarketSpot })
	_, err = h2.p.Create(ctx, request("spot-2", "spot"))
	require.NoError(t, err)
	require.Equal(t, types.InstanceLifecycleTypeSpot, h2.ec2.Instances()[0].InstanceLifecycle)
}

func TestStatesMapped(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.ec2.VisibleAfter = 0
	_, err := h.p.Create(ctx, request("web-1", "web"))
	require.NoError(t, err)
	id := *h.ec2.Instances()[0].InstanceId
	for _, tc := range []struct {
		ec2  types.InstanceStateName
		want provider.State
		gone bool
	}{
		{types.InstanceStateNameRunning, provider.StateRunning, false},
		{types.InstanceStateNameStopping, provider.StateStopped, false},
		{types.InstanceStateNameStopped, provider.StateStopped, false},
		{types.InstanceStateNameTerminated, "", true},
	} {
		require.NoError(t, h.ec2.SetState(id, tc.ec2))
		st, err := h.p.Status(ctx, "web-1")
		if tc.gone {
			require.ErrorIs(t, err, provider.ErrNotFound, tc.ec2)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, st.State, tc.ec2)
		require.Contains(t, st.Message, string(tc.ec2))
	}
}

func TestLaunchTemplateAndArgs(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, func(o *aws.Options) {
		o.ImageID = ""
		o.LaunchTemplate = aws.LaunchTemplate{Name: "workers", Version: "$Latest"}
		o.IAMInstanceProfile = "nstance-agent"
	})
	_, err := h.p.Create(ctx, request("web-1", "web"))
	require.NoError(t, err)
	in := h.ec2.RunInputs()[0]
	require.Nil(t, in.ImageId)
	require.Equal(t, "workers", *in.LaunchTemplate.LaunchTemplateName)
	require.Equal(t, "$Latest", *in.LaunchTemplate.Version)
	require.Equal(t, "nstance-agent", *in.IamInstanceProfile.Name)

	req := request("gpu-1", "gpu")
	req.InstanceType = ""
	req.Args = map[string]string{aws.ArgLaunchTemplate: "lt-0abc", aws.ArgLaunchTemplateVersion: "3", aws.ArgImageID: "ami-gpu",
		aws.ArgSecurityGroupIDs: "sg-2, sg-3", aws.ArgIAMInstanceProfile: "arn:aws:iam::1:instance-profile/gpu", aws.ArgKeyName: "ops"}
	_, err = h.p.Create(ctx, req)
	require.NoError(t, err)
	in = h.ec2.RunInputs()[1]
	require.Equal(t, "lt-0abc", *in.LaunchTemplate.LaunchTemplateId)
	require.Nil(t, in.LaunchTemplate.LaunchTemplateName)
	require.Equal(t, "3", *in.LaunchTemplate.Version)
	require.Equal(t, "ami-gpu", *in.ImageId)
	require.Equal(t, types.InstanceType(""), in.InstanceType, "the launch template's type")
	require.Equal(t, []string{"sg-2", "sg-3"}, in.SecurityGroupIds)
	require.Equal(t, "arn:aws:iam::1:instance-profile/gpu", *in.IamInstanceProfile.Arn)
	require.Equal(t, "ops", *in.KeyName)

	// The group's image (the reserved arg) wins over the template's aws.image_id.
	req = request("img-1", "gpu")
	req.Args = map[string]string{aws.ArgImageID: "ami-gpu", provider.ArgImage: "ami-node2"}
	_, err = h.p.Create(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "ami-node2", *h.ec2.RunInputs()[2].ImageId)

	req = request("bad-0", "bad")
	req.Args = map[string]string{provider.ArgImage: "node-image"}
	_, err = h.p.Create(ctx, req)
	require.ErrorContains(t, err, `image: want ami-…, got "node-image"`)
	req = request("bad-1", "bad")
	req.Args = map[string]string{aws.ArgMarket: "reserved"}
	_, err = h.p.Create(ctx, req)
	require.ErrorContains(t, err, `aws.market: want "on-demand" or "spot", got "reserved"`)
	req = request("bad-2", "bad")
	req.SubnetPool = "nope"
	_, err = h.p.Create(ctx, req)
	require.ErrorContains(t, err, `subnet pool "nope"`)
	require.Len(t, h.ec2.RunInputs(), 3, "bad requests never reach EC2")
}

func TestSubnetChoiceIsStablePerInstance(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	used := map[string]bool{}
	for i := range 20 {
		id := "web-" + string(rune('a'+i))
		_, err := h.p.Create(ctx, request(id, "web"))
		require.NoError(t, err)
	}
	for _, in := range h.ec2.RunInputs() {
		used[*in.SubnetId] = true
	}
	require.Equal(t, map[string]bool{"subnet-a": true, "subnet-b": true}, used, "instances spread over the pool")
}

func TestIAMActions(t *testing.T) {
	require.Equal(t, []string{
		"ec2:AttachNetworkInterface", "ec2:DescribeImages", "ec2:DescribeInstanceTypes", "ec2:DescribeInstances", "ec2:DescribeNetworkInterfaces",
		"ec2:DescribeSubnets", "ec2:DetachNetworkInterface", "ec2:RunInstances", "ec2:TerminateInstances",
	}, aws.IAMActions())
}

func TestValidate(t *testing.T) {
	reg := provider.NewRegistry(aws.Kind())
	cfg := testConfig()
	cfg.Shard.Infra.Region = ""
	cfg.Shard.Infra.Options = map[string]any{"image_id": "img-1", "market": "cheap", "launch_template": map[string]any{"id": "x", "name": "y"},
		"tags": map[string]any{"nstance.dev/cluster": "x"}, "max_attempts": 0.0, "agent": map[string]any{"env_file": "relative"}}
	cfg.Shard.SubnetPools["bad"] = config.SubnetPool{Subnets: []string{"net-1"}}
	cfg.Templates = map[string]config.Template{"worker": {}}
	var got []string
	for _, e := range reg.Check(cfg) {
		got = append(got, e.Error())
	}
	require.Equal(t, []string{
		"shard.infra.region: required by the aws provider",
		"shard.infra.options.launch_template: set id or name, not both",
		`shard.infra.options.launch_template.id: want lt-…, got "x"`,
		`shard.infra.options.image_id: want ami-…, got "img-1"`,
		`shard.infra.options.market: want "on-demand" or "spot", got "cheap"`,
		"shard.infra.options.max_attempts: must be at least 1, got 0",
		"shard.infra.options.tags.nstance.dev/cluster: reserved tag key",
		`shard.infra.options.agent.env_file: want an absolute path without quotes or newlines, got "relative"`,
		`shard.subnet_pools.bad.subnets[0]: want subnet-…, got "net-1"`,
	}, got)

	cfg = testConfig()
	cfg.Shard.Infra.Options = map[string]any{"imageid": "ami-1", "agent": map[string]any{"start": 1.0}}
	got = nil
	for _, e := range reg.Check(cfg) {
		got = append(got, e.Error())
	}
	require.Equal(t, []string{"shard.infra.options.agent.start: want string, got number", "shard.infra.options.imageid: unknown key"}, got)

	// No image anywhere: the template that would launch nothing is named.
	cfg = testConfig()
	cfg.Templates = map[string]config.Template{"worker": {InstanceType: "m7g.large"}, "gpu": {Args: map[string]string{aws.ArgImageID: "ami-1"}}}
	got = nil
	for _, e := range reg.Check(cfg) {
		got = append(got, e.Error())
	}
	require.Len(t, got, 2)
	require.Equal(t, "templates.gpu.instance_type: required by the aws provider when no launch template is used (or set shard.infra.options.instance_type)", got[0])
	require.Contains(t, got[1], "templates.worker.args: no image")

	cfg.Defaults.Args = map[string]string{aws.ArgLaunchTemplate: "workers"}
	require.Empty(t, reg.Check(cfg))
	kc, err := reg.Decode(cfg)
	require.NoError(t, err)
	require.Equal(t, aws.DefaultOptions(), kc)
}

// TestConcurrentCreates: the reconciler's workers create in parallel, and
// two leaders (or a retry racing the original) may create one id at once,
// here with different parameters (the second server passes no extra agent
// environment, so its user data differs and EC2 refuses its token until
// the first instance shows): every id ends with exactly one instance.
func TestConcurrentCreates(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.ec2.VisibleAfter = 2
	other := aws.New(h.ec2, *h.opts, provider.Env{Config: func() *config.Config { return h.cfg }})
	other.Visible = h.p.Visible
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 20 {
		id := fmt.Sprintf("web-%02d", i)
		for _, p := range []*aws.Provider{h.p, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				inst, err := p.Create(ctx, request(id, "web"))
				if err == nil && inst.InstanceID != id {
					err = fmt.Errorf("created %s, got %s", id, inst.InstanceID)
				}
				errs <- err
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, h.ec2.Instances(), 20)
	list, err := other.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 20)
}
