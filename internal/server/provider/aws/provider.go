package aws

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Ownership tags on every instance (and its volumes).
const (
	TagPrefix     = "nstance.dev/"
	TagCluster    = TagPrefix + "cluster"
	TagShard      = TagPrefix + "shard"
	TagTenant     = TagPrefix + "tenant"
	TagGroup      = TagPrefix + "group"
	TagTemplate   = TagPrefix + "template"
	TagInstanceID = TagPrefix + "instance-id"
	TagProviderID = TagPrefix + "provider-id"
)

// liveStates are the instance states the provider reports; shutting-down
// and terminated instances are gone (ErrNotFound, left out of List).
var liveStates = []string{"pending", "running", "stopping", "stopped"}

// Provider manages EC2 instances of one shard. Safe for concurrent use.
type Provider struct {
	api EC2API
	o   Options
	env provider.Env
	log logr.Logger
	// Visible paces the looks of a create waiting for its instance to show
	// in DescribeInstances (after its steps, at the last delay);
	// Options.VisibilityTimeout bounds the whole wait.
	Visible wait.Backoff
	// Now is the clock of the subnet caches (default time.Now).
	Now func() time.Time

	mu sync.Mutex
	// ids maps instance ids to the EC2 instance ids learnt from creates and
	// listings: a fallback when a tag filter lags behind.
	ids map[string]string
	// types caches DescribeInstanceType answers by type name.
	types     map[string]provider.InstanceType
	typeCalls singleflight.Group
	// subnets caches free addresses and dynamic pools (subnets.go).
	subnets subnetState
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider calling api. o must have been validated.
func New(api EC2API, o Options, env provider.Env) *Provider {
	return &Provider{
		api: api, o: o, env: env, log: env.Log,
		Visible: wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 6, Cap: 10 * time.Second},
		ids:     map[string]string{},
		types:   map[string]provider.InstanceType{},
		subnets: newSubnetState(),
		Now:     time.Now,
	}
}

// launchSpec is what one instance is launched from, after args override
// the options.
type launchSpec struct {
	imageID        string
	launchTemplate LaunchTemplate
	market         string
	spotMaxPrice   string
	securityGroups []string
	profile        string
	keyName        string
}

func (o *Options) launchSpec(args map[string]string) (launchSpec, error) {
	s := launchSpec{imageID: o.ImageID, launchTemplate: o.LaunchTemplate, market: o.Market, spotMaxPrice: o.SpotMaxPrice,
		securityGroups: o.SecurityGroupIDs, profile: o.IAMInstanceProfile, keyName: o.KeyName}
	if v := args[ArgImageID]; v != "" {
		if !strings.HasPrefix(v, "ami-") {
			return s, fmt.Errorf("%s: want ami-…, got %q", ArgImageID, v)
		}
		s.imageID = v
	}
	if v := args[provider.ArgImage]; v != "" {
		if !strings.HasPrefix(v, "ami-") {
			return s, fmt.Errorf("image: want ami-…, got %q", v)
		}
		s.imageID = v
	} else if n := args[provider.ArgImageName]; n != "" {
		// The server sets the image arg from the looked-up name; without
		// it the lookup has not succeeded yet and there is no fallback.
		return s, fmt.Errorf("%s %q: not resolved yet (no successful DescribeImages and no fallback_id)", provider.ArgImageName, n)
	}
	if v := args[ArgLaunchTemplate]; v != "" {
		s.launchTemplate = LaunchTemplate{Version: s.launchTemplate.Version}
		if strings.HasPrefix(v, "lt-") {
			s.launchTemplate.ID = v
		} else {
			s.launchTemplate.Name = v
		}
	}
	if v := args[ArgLaunchTemplateVersion]; v != "" {
		s.launchTemplate.Version = v
	}
	if v := args[ArgMarket]; v != "" {
		if v != MarketOnDemand && v != MarketSpot {
			return s, fmt.Errorf("%s: want %q or %q, got %q", ArgMarket, MarketOnDemand, MarketSpot, v)
		}
		s.market = v
	}
	if v := args[ArgSpotMaxPrice]; v != "" {
		s.spotMaxPrice = v
	}
	if v := args[ArgSecurityGroupIDs]; v != "" {
		s.securityGroups = nil
		for _, sg := range strings.Split(v, ",") {
			if sg = strings.TrimSpace(sg); !strings.HasPrefix(sg, "sg-") {
				return s, fmt.Errorf("%s: want sg-…, got %q", ArgSecurityGroupIDs, sg)
			}
			s.securityGroups = append(s.securityGroups, sg)
		}
	}
	if v := args[ArgIAMInstanceProfile]; v != "" {
		s.profile = v
	}
	if v := args[ArgKeyName]; v != "" {
		s.keyName = v
	}
	if s.imageID == "" && s.launchTemplate.ID == "" && s.launchTemplate.Name == "" {
		return s, fmt.Errorf("no image: set shard.infra.options.image_id or launch_template, or the %s or %s arg", ArgImageID, ArgLaunchTemplate)
	}
	return s, nil
}

func (p *Provider) owner() (cluster, shard string) {
	cfg := p.env.Config()
	return cfg.Cluster.ID, cfg.Shard.ID
}

func (p *Provider) tags(req provider.CreateRequest) []types.Tag {
	m := map[string]string{}
	for k, v := range p.o.Tags {
		m[k] = v
	}
	m["Name"] = req.InstanceID
	m[TagCluster], m[TagShard], m[TagInstanceID], m[TagProviderID] = req.Cluster, req.Shard, req.InstanceID, req.ProviderID
	if req.Tenant != "" {
		m[TagTenant] = req.Tenant
	}
	if req.GroupID != "" {
		m[TagGroup] = req.GroupID
	}
	if req.Template != "" {
		m[TagTemplate] = req.Template
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]types.Tag, len(keys))
	for i, k := range keys {
		out[i] = types.Tag{Key: awssdk.String(k), Value: awssdk.String(m[k])}
	}
	return out
}

// runInput builds the RunInstances request of req.
func (p *Provider) runInput(ctx context.Context, req provider.CreateRequest) (*ec2.RunInstancesInput, error) {
	spec, err := p.o.launchSpec(req.Args)
	if err != nil {
		return nil, err
	}
	subnet, err := p.subnet(ctx, req)
	if err != nil {
		return nil, err
	}
	script, err := UserData(p.o.Agent, req, p.env.Local.Env)
	if err != nil {
		return nil, err
	}
	ud, err := ComposeUserData(script, req)
	if err != nil {
		return nil, err
	}
	tags := p.tags(req)
	in := &ec2.RunInstancesInput{
		ClientToken: awssdk.String(req.InstanceID),
		MinCount:    awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		UserData: awssdk.String(base64.StdEncoding.EncodeToString(ud)),
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: tags},
			{ResourceType: types.ResourceTypeVolume, Tags: tags},
		},
		// IMDSv2 only (the agent reads the spot notice with a session
		// token), and a token's PUT response travels one hop: processes of
		// the node's own network namespace get one, pods behind it (one
		// hop more) do not, so they cannot read the user data (the agent's
		// nonce) or the instance's role credentials.
		MetadataOptions: &types.InstanceMetadataOptionsRequest{HttpTokens: types.HttpTokensStateRequired,
			HttpPutResponseHopLimit: awssdk.Int32(1), HttpEndpoint: types.InstanceMetadataEndpointStateEnabled},
		SecurityGroupIds: spec.securityGroups,
	}
	if spec.imageID != "" {
		in.ImageId = awssdk.String(spec.imageID)
	}
	if lt := spec.launchTemplate; lt.ID != "" || lt.Name != "" {
		in.LaunchTemplate = &types.LaunchTemplateSpecification{}
		if lt.ID != "" {
			in.LaunchTemplate.LaunchTemplateId = awssdk.String(lt.ID)
		} else {
			in.LaunchTemplate.LaunchTemplateName = awssdk.String(lt.Name)
		}
		if lt.Version != "" {
			in.LaunchTemplate.Version = awssdk.String(lt.Version)
		}
	}
	if it := req.InstanceType; it != "" {
		in.InstanceType = types.InstanceType(it)
	} else if p.o.InstanceType != "" {
		in.InstanceType = types.InstanceType(p.o.InstanceType)
	}
	if subnet != "" {
		in.SubnetId = awssdk.String(subnet)
	}
	if spec.profile != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{}
		if strings.HasPrefix(spec.profile, "arn:") {
			in.IamInstanceProfile.Arn = awssdk.String(spec.profile)
		} else {
			in.IamInstanceProfile.Name = awssdk.String(spec.profile)
		}
	}
	if spec.keyName != "" {
		in.KeyName = awssdk.String(spec.keyName)
	}
	if spec.market == MarketSpot {
		so := &types.SpotMarketOptions{SpotInstanceType: types.SpotInstanceTypeOneTime,
			InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate}
		if spec.spotMaxPrice != "" {
			so.MaxPrice = awssdk.String(spec.spotMaxPrice)
		}
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot, SpotOptions: so}
	}
	return in, nil
}

// Create implements provider.Provider. The instance id is the client
// token: a repeated create (after a lost response, a throttled retry, a new
// leader) returns the instance the first one launched.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return provider.Instance{}, err
	}
	in, err := p.runInput(ctx, req)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	out, err := p.api.RunInstances(ctx, in)
	if errorCode(err) == "IdempotentParameterMismatch" {
		// The token launched an instance with other parameters (the pool
		// or an arg changed between attempts, another server's create
		// raced this one): that instance is this id's, once EC2 shows it.
		if inst, ferr := p.waitFound(ctx, req.InstanceID); ferr == nil {
			return inst, nil
		}
	}
	if err != nil {
		return provider.Instance{}, fmt.Errorf("RunInstances %s: %w", req.InstanceID, err)
	}
	if len(out.Instances) != 1 || out.Instances[0].InstanceId == nil {
		return provider.Instance{}, fmt.Errorf("RunInstances %s: want 1 instance, got %d", req.InstanceID, len(out.Instances))
	}
	ec2ID := *out.Instances[0].InstanceId
	p.remember(req.InstanceID, ec2ID)
	p.mu.Lock()
	delete(p.subnets.chosen, req.InstanceID)
	p.mu.Unlock()
	p.log.V(1).Info("launched", "instance", req.InstanceID, "ec2", ec2ID, "subnet", awssdk.ToString(in.SubnetId), "market", p.market(in))
	got, err := p.waitVisible(ctx, ec2ID)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s (%s) launched but not visible: %w", req.InstanceID, ec2ID, err)
	}
	inst := toInstance(got)
	if inst.InstanceID == "" {
		inst.InstanceID = req.InstanceID
	}
	if inst.ProviderID == "" {
		inst.ProviderID = req.ProviderID
	}
	return inst, nil
}

// waitVisible describes ec2ID until EC2 reports it: right after
// RunInstances, DescribeInstances may not know the id yet
// (InvalidInstanceID.NotFound), which the SDK does not retry.
func (p *Provider) waitVisible(ctx context.Context, ec2ID string) (types.Instance, error) {
	var found types.Instance
	var last error
	ctx, cancel := context.WithTimeout(ctx, p.o.VisibilityTimeout.D())
	defer cancel()
	err := p.Visible.DelayFunc().Until(ctx, true, false, func(ctx context.Context) (bool, error) {
		out, err := p.api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{ec2ID}})
		switch {
		case errorCode(err) == codeInstanceNotFound || throttled(err):
			last = err
			return false, nil
		case err != nil:
			return false, err
		}
		for _, r := range out.Reservations {
			for _, i := range r.Instances {
				if awssdk.ToString(i.InstanceId) == ec2ID {
					found = i
					return true, nil
				}
			}
		}
		last = fmt.Errorf("not in the DescribeInstances answer")
		return false, nil
	})
	if err != nil {
		if last != nil && (wait.Interrupted(err) || errors.Is(err, context.DeadlineExceeded)) {
			return found, fmt.Errorf("%w (last: %v)", err, last)
		}
		return found, err
	}
	return found, nil
}

// waitFound looks the instance up by its tags until EC2 shows it (within
// the visibility timeout).
func (p *Provider) waitFound(ctx context.Context, id string) (provider.Instance, error) {
	var inst provider.Instance
	ctx, cancel := context.WithTimeout(ctx, p.o.VisibilityTimeout.D())
	defer cancel()
	err := p.Visible.DelayFunc().Until(ctx, true, false, func(ctx context.Context) (bool, error) {
		got, err := p.Status(ctx, id)
		switch {
		case err == nil:
			inst = got
			return true, nil
		case errors.Is(err, provider.ErrNotFound) || throttled(err):
			return false, nil
		}
		return false, err
	})
	return inst, err
}

func (p *Provider) market(in *ec2.RunInstancesInput) string {
	if in.InstanceMarketOptions != nil {
		return string(in.InstanceMarketOptions.MarketType)
	}
	return MarketOnDemand
}

func (p *Provider) remember(id, ec2ID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids[id] = ec2ID
}

func (p *Provider) known(id string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.ids[id]
	return v, ok
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ids, id)
	delete(p.subnets.chosen, id)
}

func (p *Provider) now() time.Time { return p.Now() }

func filter(name string, values ...string) types.Filter {
	return types.Filter{Name: awssdk.String(name), Values: values}
}

// describe returns every live instance of this shard matching extra filters.
func (p *Provider) describe(ctx context.Context, extra ...types.Filter) ([]types.Instance, error) {
	cluster, shard := p.owner()
	in := &ec2.DescribeInstancesInput{Filters: append([]types.Filter{
		filter("tag:"+TagCluster, cluster), filter("tag:"+TagShard, shard),
		filter("instance-state-name", liveStates...),
	}, extra...)}
	var out []types.Instance
	pages := ec2.NewDescribeInstancesPaginator(p.api, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("DescribeInstances: %w", err)
		}
		for _, r := range page.Reservations {
			out = append(out, r.Instances...)
		}
	}
	return out, nil
}

// find returns the live EC2 instances of one instance id: by tag, else by
// the EC2 id a create or listing of this process learnt (tag filters can
// lag behind a launch).
func (p *Provider) find(ctx context.Context, id string) ([]types.Instance, error) {
	found, err := p.describe(ctx, filter("tag:"+TagInstanceID, id))
	if err != nil || len(found) > 0 {
		return found, err
	}
	ec2ID, ok := p.known(id)
	if !ok {
		return nil, nil
	}
	out, err := p.api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{ec2ID}})
	if errorCode(err) == codeInstanceNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("DescribeInstances %s: %w", ec2ID, err)
	}
	for _, r := range out.Reservations {
		for _, i := range r.Instances {
			if live(i) {
				found = append(found, i)
			}
		}
	}
	return found, nil
}

func live(i types.Instance) bool {
	if i.State == nil {
		return false
	}
	switch i.State.Name {
	case types.InstanceStateNameShuttingDown, types.InstanceStateNameTerminated:
		return false
	}
	return true
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	found, err := p.find(ctx, id)
	if err != nil {
		return provider.Instance{}, err
	}
	if len(found) == 0 {
		return provider.Instance{}, fmt.Errorf("%w: %s", provider.ErrNotFound, id)
	}
	p.remember(id, awssdk.ToString(found[0].InstanceId))
	inst := toInstance(found[0])
	inst.InstanceID = id
	return inst, nil
}

// List implements provider.Provider: every live instance tagged with this
// cluster and shard, sorted by instance id.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	found, err := p.describe(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]provider.Instance, 0, len(found))
	for _, i := range found {
		inst := toInstance(i)
		if inst.InstanceID == "" {
			continue // tagged by hand, not ours to report
		}
		p.remember(inst.InstanceID, awssdk.ToString(i.InstanceId))
		out = append(out, inst)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].InstanceID < out[b].InstanceID })
	return out, nil
}

// Delete implements provider.Provider: terminates every live EC2 instance
// of the id; none is not an error.
func (p *Provider) Delete(ctx context.Context, id string) error {
	found, err := p.find(ctx, id)
	if err != nil {
		return err
	}
	var ids []string
	for _, i := range found {
		ids = append(ids, awssdk.ToString(i.InstanceId))
	}
	if len(ids) > 0 {
		_, err = p.api.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids})
		if err != nil && errorCode(err) != codeInstanceNotFound {
			return fmt.Errorf("TerminateInstances %s (%s): %w", id, strings.Join(ids, ", "), err)
		}
	}
	p.forget(id)
	return nil
}

func tag(tags []types.Tag, key string) string {
	for _, t := range tags {
		if awssdk.ToString(t.Key) == key {
			return awssdk.ToString(t.Value)
		}
	}
	return ""
}

// toInstance maps an EC2 instance to the provider's view: pending →
// pending, running → running, stopping/stopped → stopped; shutting-down and
// terminated are reported stopped where they still show (a create's
// answer), and are otherwise absent.
func toInstance(i types.Instance) provider.Instance {
	out := provider.Instance{InstanceID: tag(i.Tags, TagInstanceID), ProviderID: tag(i.Tags, TagProviderID), State: provider.StatePending}
	state := types.InstanceStateName("")
	if i.State != nil {
		state = i.State.Name
	}
	switch state {
	case types.InstanceStateNameRunning:
		out.State = provider.StateRunning
	case types.InstanceStateNameStopping, types.InstanceStateNameStopped,
		types.InstanceStateNameShuttingDown, types.InstanceStateNameTerminated:
		out.State = provider.StateStopped
	}
	var msg []string
	if state != "" {
		msg = append(msg, "ec2 "+awssdk.ToString(i.InstanceId)+" "+string(state))
	}
	if i.InstanceLifecycle == types.InstanceLifecycleTypeSpot {
		msg = append(msg, "spot")
	}
	if i.StateReason != nil && awssdk.ToString(i.StateReason.Message) != "" && state != types.InstanceStateNameRunning {
		msg = append(msg, awssdk.ToString(i.StateReason.Message))
	}
	out.Message = strings.Join(msg, "; ")
	seen := map[string]bool{}
	add := func(s *string) {
		if v := awssdk.ToString(s); v != "" && !seen[v] {
			seen[v] = true
			out.Addresses = append(out.Addresses, v)
		}
	}
	add(i.PrivateIpAddress)
	for _, ni := range i.NetworkInterfaces {
		for _, a := range ni.PrivateIpAddresses {
			add(a.PrivateIpAddress)
		}
		for _, a := range ni.Ipv6Addresses {
			add(a.Ipv6Address)
		}
	}
	add(i.PublicIpAddress)
	return out
}
