package fake

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"sync"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	elb "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	elbtypes "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"
)

// ELBv2 operation names.
const (
	OpRegisterTargets               = "RegisterTargets"
	OpDeregisterTargets             = "DeregisterTargets"
	OpDescribeTargetHealth          = "DescribeTargetHealth"
	OpDescribeTargetGroupAttributes = "DescribeTargetGroupAttributes"
)

// ELB is a stateful fake of the ELBv2 target group calls: target groups of
// instance or ip targets, registration checked against the fake EC2 (a
// target must be a running instance, or a private address of one),
// targets that start healthy, and deregistration that drains for a number
// of DescribeTargetHealth looks (DrainLooks) before the target is gone.
type ELB struct {
	ec2 *EC2
	mu  sync.Mutex
	// DrainLooks: a deregistered target shows draining for this many
	// DescribeTargetHealth calls of its group, then is gone.
	DrainLooks int
	groups     map[string]*targetGroup
	calls      map[string]int
	throttle   map[string]int
}

type targetGroup struct {
	kind    elbtypes.TargetTypeEnum
	port    int32
	delay   int
	targets map[string]*target // by id:port
}

type target struct {
	id      string
	port    int32
	state   elbtypes.TargetHealthStateEnum
	drainIn int
}

// NewELB returns a fake ELBv2 whose targets are checked against ec2.
func NewELB(ec2 *EC2) *ELB {
	return &ELB{ec2: ec2, groups: map[string]*targetGroup{}, calls: map[string]int{}, throttle: map[string]int{}}
}

// AddTargetGroup creates a target group (instance or ip) with its port and
// deregistration delay in seconds.
func (f *ELB) AddTargetGroup(arn string, kind elbtypes.TargetTypeEnum, port int32, delaySeconds int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[arn] = &targetGroup{kind: kind, port: port, delay: delaySeconds, targets: map[string]*target{}}
}

// Throttle makes the next n calls of op fail with Throttling.
func (f *ELB) Throttle(op string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttle[op] += n
}

// Calls returns how often op was called.
func (f *ELB) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Targets returns the targets of a group with their states, "id:port=state",
// sorted.
func (f *ELB) Targets(arn string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.groups[arn]
	if !ok {
		return nil
	}
	var out []string
	for _, t := range g.targets {
		out = append(out, fmt.Sprintf("%s:%d=%s", t.id, t.port, t.state))
	}
	sort.Strings(out)
	return out
}

// Put registers a target behind the provider's back (healthy).
func (f *ELB) Put(arn, id string, port int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.groups[arn]
	g.targets[fmt.Sprintf("%s:%d", id, port)] = &target{id: id, port: port, state: elbtypes.TargetHealthStateEnumHealthy}
}

// Drop removes a target behind the provider's back.
func (f *ELB) Drop(arn, id string, port int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.groups[arn].targets, fmt.Sprintf("%s:%d", id, port))
}

func (f *ELB) enter(op string) error {
	f.calls[op]++
	if f.throttle[op] > 0 {
		f.throttle[op]--
		return apiError("Throttling", "Rate exceeded")
	}
	return nil
}

func (f *ELB) group(arn *string) (*targetGroup, error) {
	g, ok := f.groups[awssdk.ToString(arn)]
	if !ok {
		return nil, apiError("TargetGroupNotFound", fmt.Sprintf("One or more target groups not found: '%s'", awssdk.ToString(arn)))
	}
	return g, nil
}

// valid checks a target against the fake EC2: a running instance id
// (instance groups) or a private IPv4 address of a running instance (ip).
func (f *ELB) valid(g *targetGroup, id string) error {
	f.ec2.mu.Lock()
	defer f.ec2.mu.Unlock()
	for _, i := range f.ec2.instances {
		if i.State.Name != types.InstanceStateNameRunning && i.State.Name != types.InstanceStateNamePending {
			continue
		}
		if g.kind == elbtypes.TargetTypeEnumIp && awssdk.ToString(i.PrivateIpAddress) == id {
			return nil
		}
		if g.kind != elbtypes.TargetTypeEnumIp && awssdk.ToString(i.InstanceId) == id {
			return nil
		}
	}
	if g.kind == elbtypes.TargetTypeEnumIp {
		if _, err := netip.ParseAddr(id); err != nil {
			return apiError("ValidationError", fmt.Sprintf("'%s' is not a valid IP address", id))
		}
		return apiError("InvalidTarget", fmt.Sprintf("The IP address '%s' is not within the VPC of the target group", id))
	}
	return apiError("InvalidTarget", fmt.Sprintf("The following targets are not in a running state and cannot be registered: '%s'", id))
}

func (g *targetGroup) port0(d elbtypes.TargetDescription) int32 {
	if d.Port != nil {
		return *d.Port
	}
	return g.port
}

// RegisterTargets adds targets (healthy at once); a registered or draining
// one becomes healthy again.
func (f *ELB) RegisterTargets(_ context.Context, in *elb.RegisterTargetsInput, _ ...func(*elb.Options)) (*elb.RegisterTargetsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpRegisterTargets); err != nil {
		return nil, err
	}
	g, err := f.group(in.TargetGroupArn)
	if err != nil {
		return nil, err
	}
	for _, d := range in.Targets {
		if err := f.valid(g, awssdk.ToString(d.Id)); err != nil {
			return nil, err
		}
	}
	for _, d := range in.Targets {
		port := g.port0(d)
		g.targets[fmt.Sprintf("%s:%d", awssdk.ToString(d.Id), port)] = &target{id: awssdk.ToString(d.Id), port: port, state: elbtypes.TargetHealthStateEnumHealthy}
	}
	return &elb.RegisterTargetsOutput{}, nil
}

// DeregisterTargets starts draining targets; unknown ones are ignored, as
// ELBv2 does.
func (f *ELB) DeregisterTargets(_ context.Context, in *elb.DeregisterTargetsInput, _ ...func(*elb.Options)) (*elb.DeregisterTargetsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDeregisterTargets); err != nil {
		return nil, err
	}
	g, err := f.group(in.TargetGroupArn)
	if err != nil {
		return nil, err
	}
	for _, d := range in.Targets {
		if t, ok := g.targets[fmt.Sprintf("%s:%d", awssdk.ToString(d.Id), g.port0(d))]; ok && t.state != elbtypes.TargetHealthStateEnumDraining {
			t.state, t.drainIn = elbtypes.TargetHealthStateEnumDraining, f.DrainLooks
		}
	}
	return &elb.DeregisterTargetsOutput{}, nil
}

// DescribeTargetHealth lists a group's targets; each look counts down the
// drain of draining targets.
func (f *ELB) DescribeTargetHealth(_ context.Context, in *elb.DescribeTargetHealthInput, _ ...func(*elb.Options)) (*elb.DescribeTargetHealthOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDescribeTargetHealth); err != nil {
		return nil, err
	}
	g, err := f.group(in.TargetGroupArn)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(g.targets))
	for k := range g.targets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := &elb.DescribeTargetHealthOutput{}
	for _, k := range keys {
		t := g.targets[k]
		if t.state == elbtypes.TargetHealthStateEnumDraining {
			if t.drainIn <= 0 {
				delete(g.targets, k)
				continue
			}
			t.drainIn--
		}
		out.TargetHealthDescriptions = append(out.TargetHealthDescriptions, elbtypes.TargetHealthDescription{
			Target:       &elbtypes.TargetDescription{Id: awssdk.String(t.id), Port: awssdk.Int32(t.port)},
			TargetHealth: &elbtypes.TargetHealth{State: t.state},
		})
	}
	return out, nil
}

// DescribeTargetGroupAttributes answers the deregistration delay.
func (f *ELB) DescribeTargetGroupAttributes(_ context.Context, in *elb.DescribeTargetGroupAttributesInput, _ ...func(*elb.Options)) (*elb.DescribeTargetGroupAttributesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDescribeTargetGroupAttributes); err != nil {
		return nil, err
	}
	g, err := f.group(in.TargetGroupArn)
	if err != nil {
		return nil, err
	}
	return &elb.DescribeTargetGroupAttributesOutput{Attributes: []elbtypes.TargetGroupAttribute{
		{Key: awssdk.String("deregistration_delay.timeout_seconds"), Value: awssdk.String(strconv.Itoa(g.delay))},
		{Key: awssdk.String("stickiness.enabled"), Value: awssdk.String("false")},
	}}, nil
}
