package aws_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
)

func TestChooseSubnet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		subnets []aws.SubnetChoice
		floor   int
		want    []string // any of these
		err     string
	}{
		{name: "fewest members first", subnets: []aws.SubnetChoice{{"a", 100, 2}, {"b", 50, 1}, {"c", 200, 3}}, floor: 8, want: []string{"b"}},
		{name: "then most free", subnets: []aws.SubnetChoice{{"a", 100, 1}, {"b", 50, 1}}, floor: 8, want: []string{"a"}},
		{name: "below the floor is skipped", subnets: []aws.SubnetChoice{{"a", 7, 0}, {"b", 8, 5}}, floor: 8, want: []string{"b"}},
		{name: "exact ties by hash", subnets: []aws.SubnetChoice{{"a", 100, 0}, {"b", 100, 0}}, floor: 8, want: []string{"a", "b"}},
		{name: "all full", subnets: []aws.SubnetChoice{{"b", 0, 0}, {"a", 3, 2}}, floor: 8,
			err: `subnet pool is full: "web-pool" has no subnet with at least 8 free addresses (a: 3, b: 0)`},
		{name: "empty", floor: 8, err: `subnet pool "web-pool" has no subnets`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := aws.ChooseSubnet("web-pool", tc.subnets, tc.floor, "web-1234")
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Contains(t, tc.want, got)
			again, _ := aws.ChooseSubnet("web-pool", tc.subnets, tc.floor, "web-1234")
			require.Equal(t, got, again, "one instance asks for one subnet")
		})
	}
	// Ties spread over the tied subnets by instance id.
	seen := map[string]bool{}
	for i := range 20 {
		id, err := aws.ChooseSubnet("p", []aws.SubnetChoice{{"a", 100, 0}, {"b", 100, 0}, {"c", 10, 0}}, 8, fmt.Sprintf("web-%d", i))
		require.NoError(t, err)
		seen[id] = true
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, seen)
}

func subnetsOf(f *fake.EC2) map[string]int {
	out := map[string]int{}
	for _, i := range f.Instances() {
		if i.State.Name != types.InstanceStateNameShuttingDown && i.State.Name != types.InstanceStateNameTerminated {
			out[awssdk.ToString(i.SubnetId)]++
		}
	}
	return out
}

// TestSubnetCapacity: with one subnet of the pool nearly full, new members
// go to the others (spread between them); with every subnet full the create
// fails with an error naming the pool.
func TestSubnetCapacity(t *testing.T) {
	ctx := context.Background()
	f := fake.New()
	f.AddSubnet("subnet-a", 9, nil)
	f.AddSubnet("subnet-b", 200, nil)
	f.AddSubnet("subnet-c", 200, nil)
	cfg := testConfig()
	cfg.Shard.SubnetPools = map[string]config.SubnetPool{"default": {Subnets: []string{"subnet-a", "subnet-b", "subnet-c"}}}
	o := aws.DefaultOptions()
	o.ImageID, o.SubnetMinFreeAddresses = "ami-1", 10
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	p := aws.New(f, *o, provider.Env{Config: func() *config.Config { return cfg }})
	p.Now = func() time.Time { return now }

	for i := range 6 {
		_, err := p.Create(ctx, request(fmt.Sprintf("web-%d", i), "web"))
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"subnet-b": 3, "subnet-c": 3}, subnetsOf(f), "nothing in the nearly full subnet; spread over the others")
	require.Equal(t, 1, f.Calls(fake.OpDescribeSubnets), "free addresses cached for the refresh interval")

	// Room again in subnet-a (seen after the interval): the group's
	// members go there first, it holds none.
	f.SetFree("subnet-a", 100)
	now = now.Add(aws.DefaultSubnetRefreshInterval)
	_, err := p.Create(ctx, request("web-6", "web"))
	require.NoError(t, err)
	require.Equal(t, map[string]int{"subnet-a": 1, "subnet-b": 3, "subnet-c": 3}, subnetsOf(f))

	// Every subnet below the floor.
	for _, s := range []string{"subnet-a", "subnet-b", "subnet-c"} {
		f.SetFree(s, 2)
	}
	now = now.Add(aws.DefaultSubnetRefreshInterval)
	_, err = p.Create(ctx, request("web-7", "web"))
	require.True(t, errors.Is(err, aws.ErrPoolFull), "%v", err)
	require.EqualError(t, err, `instance web-7: subnet pool is full: "default" has no subnet with at least 10 free addresses (subnet-a: 2, subnet-b: 2, subnet-c: 2)`)
}

// TestDynamicSubnetPool: a pool defined by tags finds its subnets with
// DescribeSubnets and sees a newly tagged subnet after the refresh interval.
func TestDynamicSubnetPool(t *testing.T) {
	ctx := context.Background()
	f := fake.New()
	tags := map[string]string{"tier": "private"}
	f.AddSubnet("subnet-a", 100, tags)
	f.AddSubnet("subnet-public", 1000, map[string]string{"tier": "public"})
	cfg := testConfig()
	cfg.Shard.SubnetPools = nil
	cfg.Shard.DynamicSubnetPools = map[string]config.DynamicSubnetPool{"private": {Tags: tags}}
	o := aws.DefaultOptions()
	o.ImageID = "ami-1"
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	p := aws.New(f, *o, provider.Env{Config: func() *config.Config { return cfg }})
	p.Now = func() time.Time { return now }
	req := func(id string) provider.CreateRequest {
		r := request(id, "web")
		r.SubnetPool = "private"
		return r
	}
	_, err := p.Create(ctx, req("web-0"))
	require.NoError(t, err)
	f.AddSubnet("subnet-b", 100, tags)
	_, err = p.Create(ctx, req("web-1"))
	require.NoError(t, err)
	require.Equal(t, map[string]int{"subnet-a": 2}, subnetsOf(f), "the pool's subnets are cached")

	now = now.Add(aws.DefaultSubnetRefreshInterval)
	_, err = p.Create(ctx, req("web-2"))
	require.NoError(t, err)
	require.Equal(t, map[string]int{"subnet-a": 2, "subnet-b": 1}, subnetsOf(f), "the newly tagged subnet takes the next member")

	// No subnet carries the tags: the pool is named.
	cfg.Shard.DynamicSubnetPools["none"] = config.DynamicSubnetPool{Tags: map[string]string{"tier": "nowhere"}}
	r := req("web-3")
	r.SubnetPool = "none"
	_, err = p.Create(ctx, r)
	require.ErrorIs(t, err, aws.ErrPoolFull)
	require.ErrorContains(t, err, `"none" has no subnets`)
}
