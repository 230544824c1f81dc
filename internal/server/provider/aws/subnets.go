package aws

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Defaults of the subnet options.
const (
	// DefaultSubnetMinFree is the floor of free addresses below which a
	// subnet takes no new instance.
	DefaultSubnetMinFree = 8
	// DefaultSubnetRefreshInterval is how long free address counts and the
	// subnets of dynamic pools are used before DescribeSubnets again.
	DefaultSubnetRefreshInterval = time.Minute
)

// ErrPoolFull reports that no subnet of a pool has the floor of free
// addresses.
var ErrPoolFull = errors.New("subnet pool is full")

// SubnetChoice is what the choice of a subnet knows about one subnet of a
// pool: its free addresses and how many members of the instance's group
// it holds.
type SubnetChoice struct {
	ID      string
	Free    int
	Members int
}

// ChooseSubnet picks the subnet of pool for instanceID among subnets: of
// those with at least floor free addresses, the one holding the fewest
// members of the group (spread), then the one with the most free
// addresses; remaining ties are broken by a hash of the instance id, so one
// instance asks for the same subnet again. None with the floor is
// ErrPoolFull, naming the pool and every subnet's count.
func ChooseSubnet(pool string, subnets []SubnetChoice, floor int, instanceID string) (string, error) {
	if len(subnets) == 0 {
		return "", fmt.Errorf("subnet pool %q has no subnets", pool)
	}
	var ok []SubnetChoice
	for _, s := range subnets {
		if s.Free >= floor {
			ok = append(ok, s)
		}
	}
	if len(ok) == 0 {
		counts := make([]string, 0, len(subnets))
		for _, s := range subnets {
			counts = append(counts, fmt.Sprintf("%s: %d", s.ID, s.Free))
		}
		sort.Strings(counts)
		return "", fmt.Errorf("%w: %q has no subnet with at least %d free addresses (%s)", ErrPoolFull, pool, floor, strings.Join(counts, ", "))
	}
	sort.Slice(ok, func(a, b int) bool {
		if ok[a].Members != ok[b].Members {
			return ok[a].Members < ok[b].Members
		}
		if ok[a].Free != ok[b].Free {
			return ok[a].Free > ok[b].Free
		}
		return ok[a].ID < ok[b].ID
	})
	best := 1
	for best < len(ok) && ok[best].Members == ok[0].Members && ok[best].Free == ok[0].Free {
		best++
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(instanceID))
	return ok[h.Sum32()%uint32(best)].ID, nil
}

// subnetState caches what DescribeSubnets said: free addresses per subnet
// and the subnets of each dynamic pool, with when each was read.
type subnetState struct {
	free    map[string]int
	freeAt  map[string]time.Time
	pools   map[string][]string
	poolsAt map[string]time.Time
	chosen  map[string]string // instance id → subnet, for retries
}

func newSubnetState() subnetState {
	return subnetState{free: map[string]int{}, freeAt: map[string]time.Time{}, pools: map[string][]string{},
		poolsAt: map[string]time.Time{}, chosen: map[string]string{}}
}

func (o *Options) subnetMinFree() int {
	if o.SubnetMinFreeAddresses > 0 {
		return o.SubnetMinFreeAddresses
	}
	return DefaultSubnetMinFree
}

func (o *Options) subnetRefresh() time.Duration {
	if d := o.SubnetRefreshInterval.D(); d > 0 {
		return d
	}
	return DefaultSubnetRefreshInterval
}

// poolSubnets returns the subnets of a static or dynamic pool (dynamic:
// DescribeSubnets by the pool's tags, cached for the refresh interval).
func (p *Provider) poolSubnets(ctx context.Context, pool string) ([]string, error) {
	sh := p.env.Config().Shard
	if sp, ok := sh.SubnetPools[pool]; ok {
		return sp.Subnets, nil
	}
	dp, ok := sh.DynamicSubnetPools[pool]
	if !ok {
		return nil, fmt.Errorf("subnet pool %q is not in shard.subnet_pools or shard.dynamic_subnet_pools", pool)
	}
	now := p.now()
	p.mu.Lock()
	ids, at := p.subnets.pools[pool], p.subnets.poolsAt[pool]
	p.mu.Unlock()
	if !at.IsZero() && now.Sub(at) < p.o.subnetRefresh() {
		return ids, nil
	}
	keys := make([]string, 0, len(dp.Tags))
	for k := range dp.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	in := &ec2.DescribeSubnetsInput{}
	for _, k := range keys {
		in.Filters = append(in.Filters, filter("tag:"+k, dp.Tags[k]))
	}
	found, err := p.describeSubnets(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("subnet pool %q: %w", pool, err)
	}
	ids = append([]string(nil), found...)
	sort.Strings(ids)
	p.mu.Lock()
	p.subnets.pools[pool], p.subnets.poolsAt[pool] = ids, now
	p.mu.Unlock()
	return ids, nil
}

// describeSubnets runs DescribeSubnets (all pages), records every
// answered subnet's free addresses and returns their ids.
func (p *Provider) describeSubnets(ctx context.Context, in *ec2.DescribeSubnetsInput) ([]string, error) {
	var out []string
	now := p.now()
	pages := ec2.NewDescribeSubnetsPaginator(p.api, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("DescribeSubnets: %w", err)
		}
		p.mu.Lock()
		for _, s := range page.Subnets {
			id := awssdk.ToString(s.SubnetId)
			if id == "" || (s.State != "" && s.State != types.SubnetStateAvailable) {
				continue
			}
			p.subnets.free[id], p.subnets.freeAt[id] = int(awssdk.ToInt32(s.AvailableIpAddressCount)), now
			out = append(out, id)
		}
		p.mu.Unlock()
	}
	return out, nil
}

// freeAddresses returns the free addresses of ids, asking DescribeSubnets
// for those not read within the refresh interval.
func (p *Provider) freeAddresses(ctx context.Context, ids []string) (map[string]int, error) {
	now := p.now()
	var stale []string
	p.mu.Lock()
	for _, id := range ids {
		if at := p.subnets.freeAt[id]; at.IsZero() || now.Sub(at) >= p.o.subnetRefresh() {
			stale = append(stale, id)
		}
	}
	p.mu.Unlock()
	if len(stale) > 0 {
		if _, err := p.describeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: stale}); err != nil {
			return nil, err
		}
	}
	out := make(map[string]int, len(ids))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		out[id] = p.subnets.free[id]
	}
	return out, nil
}

// groupMembers counts the live instances of req's group per subnet.
func (p *Provider) groupMembers(ctx context.Context, req provider.CreateRequest) (map[string]int, error) {
	out := map[string]int{}
	if req.GroupID == "" {
		return out, nil
	}
	extra := []types.Filter{filter("tag:"+TagGroup, req.GroupID)}
	if req.Tenant != "" {
		extra = append(extra, filter("tag:"+TagTenant, req.Tenant))
	}
	found, err := p.describe(ctx, extra...)
	if err != nil {
		return nil, err
	}
	for _, i := range found {
		if tag(i.Tags, TagInstanceID) != req.InstanceID {
			out[awssdk.ToString(i.SubnetId)]++
		}
	}
	return out, nil
}

// subnet picks the instance's subnet from its pool (ChooseSubnet over the
// pool's free addresses and the group's members). A retry of one create in
// this process asks for the subnet it asked for before (a client token
// repeated with other parameters is refused).
func (p *Provider) subnet(ctx context.Context, req provider.CreateRequest) (string, error) {
	if req.SubnetPool == "" {
		return "", nil
	}
	p.mu.Lock()
	prev, ok := p.subnets.chosen[req.InstanceID]
	p.mu.Unlock()
	if ok {
		return prev, nil
	}
	ids, err := p.poolSubnets(ctx, req.SubnetPool)
	if err != nil {
		return "", err
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("%w: %q has no subnets (no subnet carries its tags)", ErrPoolFull, req.SubnetPool)
	}
	free, err := p.freeAddresses(ctx, ids)
	if err != nil {
		return "", fmt.Errorf("subnet pool %q: %w", req.SubnetPool, err)
	}
	members, err := p.groupMembers(ctx, req)
	if err != nil {
		// The spread is a refinement: capacity still decides.
		p.log.V(1).Info("counting the group's members per subnet failed; choosing by free addresses", "instance", req.InstanceID, "error", err.Error())
	}
	choices := make([]SubnetChoice, 0, len(ids))
	for _, id := range ids {
		choices = append(choices, SubnetChoice{ID: id, Free: free[id], Members: members[id]})
	}
	id, err := ChooseSubnet(req.SubnetPool, choices, p.o.subnetMinFree(), req.InstanceID)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	// The launch takes an address: counted now, so the creates before the
	// next DescribeSubnets see it.
	p.subnets.free[id]--
	p.subnets.chosen[req.InstanceID] = id
	p.mu.Unlock()
	return id, nil
}
