// Package awslb is the aws load balancer kind: group members become
// targets of one or more ELBv2 target groups (application, network or
// gateway load balancers), as instance targets (the EC2 instance id) or IP
// targets (the instance's primary private address). Deregistration is
// ELBv2's own (the target drains for the target group's
// deregistration_delay.timeout_seconds, then is gone), so Remove has nothing
// left to do. A target is ours when the EC2 instance behind it carries this
// cluster's and shard's ownership tags (nstance.dev/cluster, shard,
// instance-id); every other target of the target groups is foreign and
// never touched.
package awslb

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	elb "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	elbtypes "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"
	"github.com/aws/smithy-go"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	awsprov "github.com/nstance-dev/nstance/internal/server/provider/aws"
)

// Name is the kind's name (load_balancers.<name>.provider).
const Name = "aws"

// Target types.
const (
	TargetInstance = "instance"
	TargetIP       = "ip"
)

// DelayAttribute is the target group attribute holding the deregistration
// delay in seconds.
const DelayAttribute = "deregistration_delay.timeout_seconds"

// DefaultDelayCacheTTL is how long a target group's delay is used before it
// is read again.
const DefaultDelayCacheTTL = 5 * time.Minute

// ELBAPI is every ELBv2 call this package makes; *elasticloadbalancingv2.Client
// implements it. Each method name is an IAM action of the
// elasticloadbalancing service (IAMActions).
type ELBAPI interface {
	RegisterTargets(ctx context.Context, in *elb.RegisterTargetsInput, opts ...func(*elb.Options)) (*elb.RegisterTargetsOutput, error)
	DeregisterTargets(ctx context.Context, in *elb.DeregisterTargetsInput, opts ...func(*elb.Options)) (*elb.DeregisterTargetsOutput, error)
	DescribeTargetHealth(ctx context.Context, in *elb.DescribeTargetHealthInput, opts ...func(*elb.Options)) (*elb.DescribeTargetHealthOutput, error)
	DescribeTargetGroupAttributes(ctx context.Context, in *elb.DescribeTargetGroupAttributesInput, opts ...func(*elb.Options)) (*elb.DescribeTargetGroupAttributesOutput, error)
}

var _ ELBAPI = (*elb.Client)(nil)

// EC2API is the EC2 call that tells our targets from foreign ones
// (DescribeInstances, already in the server's policy).
type EC2API interface {
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

// IAMActions returns the IAM actions of every ELBAPI method, sorted.
func IAMActions() []string {
	t := reflect.TypeOf((*ELBAPI)(nil)).Elem()
	out := make([]string, 0, t.NumMethod())
	for i := 0; i < t.NumMethod(); i++ {
		out = append(out, "elasticloadbalancing:"+t.Method(i).Name)
	}
	sort.Strings(out)
	return out
}

// Kind returns the aws kind for a loadbalancer.Registry.
func Kind() loadbalancer.Kind {
	return loadbalancer.Kind{Name: Name, Config: func() loadbalancer.KindConfig {
		return &Settings{TargetType: TargetInstance}
	}}
}

// Settings are the keys of one aws entry besides "provider".
type Settings struct {
	// TargetGroupARNs are the target groups every member is registered
	// with (one or more; all of TargetType).
	TargetGroupARNs []string `json:"target_group_arns"`
	// TargetType is instance (default) or ip, as the target groups were
	// created.
	TargetType string `json:"target_type"`
	// Port is the port targets are registered on (0: the target group's).
	// Required for ip targets.
	Port int `json:"port"`
	// Endpoint overrides the ELBv2 endpoint (a VPC endpoint); the region
	// is shard.infra.region.
	Endpoint string `json:"endpoint"`
}

// Validate checks the settings; key is the entry's path.
func (s *Settings) Validate(cfg *config.Config, key string) config.Errors {
	var errs config.Errors
	add := func(k, f string, a ...any) {
		errs = append(errs, config.FieldError{Key: key + k, Reason: fmt.Sprintf(f, a...)})
	}
	if len(s.TargetGroupARNs) == 0 {
		add(".target_group_arns", "must list at least one target group ARN")
	}
	seen := map[string]bool{}
	for i, a := range s.TargetGroupARNs {
		if !strings.HasPrefix(a, "arn:") || !strings.Contains(a, ":targetgroup/") {
			add(fmt.Sprintf(".target_group_arns[%d]", i), "want an ELBv2 target group ARN (arn:…:targetgroup/…), got %q", a)
		}
		if seen[a] {
			add(fmt.Sprintf(".target_group_arns[%d]", i), "listed twice")
		}
		seen[a] = true
	}
	switch s.TargetType {
	case TargetInstance:
	case TargetIP:
		if s.Port == 0 {
			add(".port", "required for ip targets")
		}
	default:
		add(".target_type", "want %q or %q, got %q", TargetInstance, TargetIP, s.TargetType)
	}
	if s.Port < 0 || s.Port > 65535 {
		add(".port", "want 1-65535, got %d", s.Port)
	}
	if cfg.Shard.Infra.Region == "" {
		errs = append(errs, config.FieldError{Key: "shard.infra.region", Reason: "required by the aws load balancer " + strings.TrimPrefix(key, "load_balancers.")})
	}
	return errs
}

// New builds the entry's provider with ELBv2 and EC2 clients for
// shard.infra.region and the default credential chain.
func (s *Settings) New(ctx context.Context, env loadbalancer.Env) (loadbalancer.Provider, error) {
	region := env.Config().Shard.Infra.Region
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(region),
		awsconfig.WithRetryer(func() awssdk.Retryer { return awsprov.NewRetryer(*awsprov.DefaultOptions()) }))
	if err != nil {
		return nil, fmt.Errorf("loading AWS config: %w", err)
	}
	client := elb.NewFromConfig(cfg, func(o *elb.Options) {
		if s.Endpoint != "" {
			o.BaseEndpoint = awssdk.String(s.Endpoint)
		}
	})
	return New(client, ec2.NewFromConfig(cfg), *s, env), nil
}

// Provider drives one entry's target groups. Safe for concurrent use.
type Provider struct {
	elb ELBAPI
	ec2 EC2API
	s   Settings
	env loadbalancer.Env
	// Now is the clock of the delay cache (default time.Now).
	Now func() time.Time

	mu      sync.Mutex
	delay   time.Duration
	delayAt time.Time
	// targets remembers the ELB target id of our instances seen by Members
	// or a lookup (strangers are deregistered by instance id alone).
	targets map[string]string
}

var _ loadbalancer.Provider = (*Provider)(nil)

// New returns a provider calling the given clients; s must be validated.
func New(elbAPI ELBAPI, ec2API EC2API, s Settings, env loadbalancer.Env) *Provider {
	return &Provider{elb: elbAPI, ec2: ec2API, s: s, env: env, Now: time.Now, targets: map[string]string{}}
}

func (p *Provider) owner() []ec2types.Filter {
	cfg := p.env.Config()
	return []ec2types.Filter{
		{Name: awssdk.String("tag:" + awsprov.TagCluster), Values: []string{cfg.Cluster.ID}},
		{Name: awssdk.String("tag:" + awsprov.TagShard), Values: []string{cfg.Shard.ID}},
	}
}

// ours describes this shard's live instances matching extra filters and
// returns their ELB target ids (EC2 id or primary private IPv4) by
// instance id.
func (p *Provider) ours(ctx context.Context, extra ...ec2types.Filter) (map[string]string, error) {
	in := &ec2.DescribeInstancesInput{Filters: append(append(p.owner(),
		ec2types.Filter{Name: awssdk.String("instance-state-name"), Values: []string{"pending", "running", "stopping", "stopped"}}), extra...)}
	out := map[string]string{}
	pages := ec2.NewDescribeInstancesPaginator(p.ec2, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("DescribeInstances: %w", err)
		}
		for _, r := range page.Reservations {
			for _, i := range r.Instances {
				id := ""
				for _, t := range i.Tags {
					if awssdk.ToString(t.Key) == awsprov.TagInstanceID {
						id = awssdk.ToString(t.Value)
					}
				}
				if id == "" {
					continue
				}
				if p.s.TargetType == TargetIP {
					out[id] = awssdk.ToString(i.PrivateIpAddress)
				} else {
					out[id] = awssdk.ToString(i.InstanceId)
				}
			}
		}
	}
	p.mu.Lock()
	for id, tid := range out {
		p.targets[id] = tid
	}
	p.mu.Unlock()
	return out, nil
}

// targetID is the ELB target id of t: its first IPv4 address (ip targets),
// else the remembered or looked-up EC2 instance id / address. "" with a nil
// error: the instance is gone.
func (p *Provider) targetID(ctx context.Context, t loadbalancer.Target) (string, error) {
	if p.s.TargetType == TargetIP {
		for _, a := range t.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() {
				return a, nil
			}
		}
	}
	p.mu.Lock()
	tid, ok := p.targets[t.InstanceID]
	p.mu.Unlock()
	if ok {
		return tid, nil
	}
	found, err := p.ours(ctx, ec2types.Filter{Name: awssdk.String("tag:" + awsprov.TagInstanceID), Values: []string{t.InstanceID}})
	if err != nil {
		return "", fmt.Errorf("looking up instance %s: %w", t.InstanceID, err)
	}
	return found[t.InstanceID], nil
}

func (p *Provider) description(id string) elbtypes.TargetDescription {
	d := elbtypes.TargetDescription{Id: awssdk.String(id)}
	if p.s.Port > 0 {
		d.Port = awssdk.Int32(int32(p.s.Port))
	}
	return d
}

// Register implements loadbalancer.Provider: RegisterTargets with every
// target group (a registered or draining target becomes active again).
func (p *Provider) Register(ctx context.Context, t loadbalancer.Target) error {
	id, err := p.targetID(ctx, t)
	if err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("instance %s: no live EC2 instance with this shard's ownership tags", t.InstanceID)
	}
	for _, arn := range p.s.TargetGroupARNs {
		if _, err := p.elb.RegisterTargets(ctx, &elb.RegisterTargetsInput{TargetGroupArn: awssdk.String(arn),
			Targets: []elbtypes.TargetDescription{p.description(id)}}); err != nil {
			return fmt.Errorf("RegisterTargets %s (%s) with %s: %w", t.InstanceID, id, arn, err)
		}
	}
	return nil
}

// Deregister implements loadbalancer.Provider: DeregisterTargets from every
// target group; a target (or instance) already gone is done.
func (p *Provider) Deregister(ctx context.Context, t loadbalancer.Target) error {
	id, err := p.targetID(ctx, t)
	if err != nil {
		return err
	}
	if id == "" {
		return nil
	}
	for _, arn := range p.s.TargetGroupARNs {
		_, err := p.elb.DeregisterTargets(ctx, &elb.DeregisterTargetsInput{TargetGroupArn: awssdk.String(arn),
			Targets: []elbtypes.TargetDescription{p.description(id)}})
		if err != nil && errorCode(err) != "InvalidTarget" {
			return fmt.Errorf("DeregisterTargets %s (%s) from %s: %w", t.InstanceID, id, arn, err)
		}
	}
	return nil
}

// Remove implements loadbalancer.Provider: ELBv2 drops a deregistered
// target by itself once the delay has passed.
func (p *Provider) Remove(ctx context.Context, t loadbalancer.Target) error {
	p.mu.Lock()
	delete(p.targets, t.InstanceID)
	p.mu.Unlock()
	return nil
}

// memberState folds one target's ELB states (one per target group) into
// its membership: active in every group, draining in any, else inactive
// (missing from a group, unused, unavailable).
func memberState(states []elbtypes.TargetHealthStateEnum, groups int) loadbalancer.MemberState {
	active := 0
	for _, s := range states {
		switch s {
		case elbtypes.TargetHealthStateEnumDraining, elbtypes.TargetHealthStateEnumUnhealthyDraining:
			return loadbalancer.MemberDraining
		case elbtypes.TargetHealthStateEnumHealthy, elbtypes.TargetHealthStateEnumUnhealthy, elbtypes.TargetHealthStateEnumInitial:
			active++
		}
	}
	if active == groups {
		return loadbalancer.MemberActive
	}
	return loadbalancer.MemberInactive
}

// Members implements loadbalancer.Provider: DescribeTargetHealth of every
// target group, the targets matched to this shard's instances by one
// DescribeInstances (instance-id or private address filter plus the
// ownership tags). Targets that match none are foreign and left out.
func (p *Provider) Members(ctx context.Context) ([]loadbalancer.Member, error) {
	states := map[string][]elbtypes.TargetHealthStateEnum{}
	details := map[string][]string{}
	for _, arn := range p.s.TargetGroupARNs {
		out, err := p.elb.DescribeTargetHealth(ctx, &elb.DescribeTargetHealthInput{TargetGroupArn: awssdk.String(arn)})
		if err != nil {
			return nil, fmt.Errorf("DescribeTargetHealth %s: %w", arn, err)
		}
		for _, d := range out.TargetHealthDescriptions {
			if d.Target == nil {
				continue
			}
			id := awssdk.ToString(d.Target.Id)
			st := elbtypes.TargetHealthStateEnum("")
			if d.TargetHealth != nil {
				st = d.TargetHealth.State
			}
			states[id] = append(states[id], st)
			details[id] = append(details[id], string(st))
		}
	}
	if len(states) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(states))
	for id := range states {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	name := "instance-id"
	if p.s.TargetType == TargetIP {
		name = "private-ip-address"
	}
	found, err := p.ours(ctx, ec2types.Filter{Name: awssdk.String(name), Values: ids})
	if err != nil {
		return nil, err
	}
	var out []loadbalancer.Member
	for inst, tid := range found {
		st, ok := states[tid]
		if !ok {
			continue
		}
		out = append(out, loadbalancer.Member{InstanceID: inst, State: memberState(st, len(p.s.TargetGroupARNs)),
			Detail: strings.Join(details[tid], ",")})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].InstanceID < out[b].InstanceID })
	return out, nil
}

// DeregistrationDelay implements loadbalancer.Provider: the longest
// deregistration_delay.timeout_seconds of the target groups, cached for
// DefaultDelayCacheTTL.
func (p *Provider) DeregistrationDelay(ctx context.Context) (time.Duration, error) {
	now := p.Now()
	p.mu.Lock()
	d, at := p.delay, p.delayAt
	p.mu.Unlock()
	if !at.IsZero() && now.Sub(at) < DefaultDelayCacheTTL {
		return d, nil
	}
	var longest time.Duration
	for _, arn := range p.s.TargetGroupARNs {
		out, err := p.elb.DescribeTargetGroupAttributes(ctx, &elb.DescribeTargetGroupAttributesInput{TargetGroupArn: awssdk.String(arn)})
		if err != nil {
			return 0, fmt.Errorf("DescribeTargetGroupAttributes %s: %w", arn, err)
		}
		for _, a := range out.Attributes {
			if awssdk.ToString(a.Key) != DelayAttribute {
				continue
			}
			secs, err := strconv.Atoi(awssdk.ToString(a.Value))
			if err != nil || secs < 0 {
				return 0, fmt.Errorf("target group %s: %s is %q", arn, DelayAttribute, awssdk.ToString(a.Value))
			}
			longest = max(longest, time.Duration(secs)*time.Second)
		}
	}
	p.mu.Lock()
	p.delay, p.delayAt = longest, now
	p.mu.Unlock()
	return longest, nil
}

func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}
