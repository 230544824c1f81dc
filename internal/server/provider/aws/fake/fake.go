// Package fake is a stateful, in-process EC2 for tests of the aws provider:
// it implements the provider's EC2API with instances, client tokens, tags,
// state transitions, network interfaces and their attachments, and injects
// what real EC2 does to callers: throttling (RequestLimitExceeded), lost
// responses after a committed call, instances not yet visible to
// DescribeInstances after RunInstances, and attachments that take a few
// looks to settle.
package fake

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// Operation names, as EC2 actions.
const (
	OpRunInstances              = "RunInstances"
	OpDescribeInstances         = "DescribeInstances"
	OpTerminateInstances        = "TerminateInstances"
	OpDescribeNetworkInterfaces = "DescribeNetworkInterfaces"
	OpAttachNetworkInterface    = "AttachNetworkInterface"
	OpDetachNetworkInterface    = "DetachNetworkInterface"
	OpDescribeInstanceTypes     = "DescribeInstanceTypes"
)

// Zone is the availability zone of every fake subnet.
const Zone = "us-fake-1a"

// EC2 is the fake. The zero value is not usable; call New.
type EC2 struct {
	mu sync.Mutex
	// VisibleAfter: a new instance is missing from the next VisibleAfter
	// DescribeInstances calls (by id: InvalidInstanceID.NotFound).
	VisibleAfter int
	// SettleAfter: an ENI attachment stays attaching/detaching for this
	// many DescribeNetworkInterfaces calls.
	SettleAfter int
	// PageSize, when positive, pages DescribeInstances answers.
	PageSize int

	seq       int
	instances map[string]*instance
	order     []string
	tokens    map[string]token
	enis      map[string]*eni
	subnets   map[string]bool
	throttle  map[string]int
	lose      map[string]int
	calls     map[string]int
	runs      []*ec2.RunInstancesInput
	types     map[types.InstanceType]types.InstanceTypeInfo
	typesGate chan struct{}
	// images are the AMIs DescribeImages answers; failImages fails the
	// next calls.
	images     []types.Image
	failImages int
	// subnetInfo are the subnets added with AddSubnet (free addresses, tags).
	subnetInfo map[string]*subnet
}

type instance struct {
	types.Instance
	userData []byte
	hidden   int
}

type token struct {
	ec2ID       string
	fingerprint string
}

type eni struct {
	types.NetworkInterface
	settle int
}

// New returns an empty fake EC2 whose subnets are the given ones, each
// with 4091 free addresses (none: any subnet id is accepted).
func New(subnets ...string) *EC2 {
	f := &EC2{instances: map[string]*instance{}, tokens: map[string]token{}, enis: map[string]*eni{},
		subnets: map[string]bool{}, throttle: map[string]int{}, lose: map[string]int{}, calls: map[string]int{},
		types: map[types.InstanceType]types.InstanceTypeInfo{}, subnetInfo: map[string]*subnet{}}
	for _, s := range subnets {
		f.subnets[s] = true
		f.subnetInfo[s] = &subnet{id: s, free: 4091}
	}
	return f
}

func apiError(code, msg string) error {
	return &smithy.GenericAPIError{Code: code, Message: msg, Fault: smithy.FaultClient}
}

// Throttle makes the next n calls of op fail with RequestLimitExceeded
// before they do anything.
func (f *EC2) Throttle(op string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttle[op] += n
}

// LoseResponses makes the next n calls of op take effect and then fail (a
// timeout after EC2 committed), as a dropped connection does.
func (f *EC2) LoseResponses(op string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lose[op] += n
}

// RunInputs returns every RunInstances request that was not throttled.
func (f *EC2) RunInputs() []*ec2.RunInstancesInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*ec2.RunInstancesInput(nil), f.runs...)
}

// Calls returns how often op was called (throttled calls included).
func (f *EC2) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// enter counts a call and applies throttling; callers hold f.mu.
func (f *EC2) enter(op string) error {
	f.calls[op]++
	if f.throttle[op] > 0 {
		f.throttle[op]--
		return apiError("RequestLimitExceeded", "Request limit exceeded.")
	}
	return nil
}

// leave applies a lost response; callers hold f.mu.
func (f *EC2) leave(op string) error {
	if f.lose[op] > 0 {
		f.lose[op]--
		return fmt.Errorf("%s: read: connection reset by peer (fake: the call took effect)", op)
	}
	return nil
}

func (f *EC2) nextID(prefix string) string {
	f.seq++
	return fmt.Sprintf("%s-%017x", prefix, f.seq)
}

// fingerprint is what makes two RunInstances requests "the same" for a
// client token: everything but the token itself.
func fingerprint(in *ec2.RunInstancesInput) string {
	c := *in
	c.ClientToken = nil
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// RunInstances launches one instance (MinCount = MaxCount = 1), honouring
// the client token.
func (f *EC2) RunInstances(_ context.Context, in *ec2.RunInstancesInput, _ ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpRunInstances); err != nil {
		return nil, err
	}
	f.runs = append(f.runs, in)
	if awssdk.ToInt32(in.MinCount) != 1 || awssdk.ToInt32(in.MaxCount) != 1 {
		return nil, apiError("InvalidParameterValue", "fake launches exactly one instance")
	}
	fp := fingerprint(in)
	if tok := awssdk.ToString(in.ClientToken); tok != "" {
		if len(tok) > 64 {
			return nil, apiError("InvalidParameterValue", "client token longer than 64 characters")
		}
		if t, ok := f.tokens[tok]; ok {
			if t.fingerprint != fp {
				return nil, apiError("IdempotentParameterMismatch", "client token reused with other parameters")
			}
			return &ec2.RunInstancesOutput{Instances: []types.Instance{f.instances[t.ec2ID].Instance}}, f.leave(OpRunInstances)
		}
	}
	image := awssdk.ToString(in.ImageId)
	if image == "" && in.LaunchTemplate != nil {
		image = "ami-from-" + awssdk.ToString(in.LaunchTemplate.LaunchTemplateId) + awssdk.ToString(in.LaunchTemplate.LaunchTemplateName)
	}
	if image == "" {
		return nil, apiError("MissingParameter", "The request must contain the parameter ImageId")
	}
	subnet := awssdk.ToString(in.SubnetId)
	if subnet != "" && len(f.subnets) > 0 && !f.subnets[subnet] {
		return nil, apiError("InvalidSubnetID.NotFound", fmt.Sprintf("The subnet ID '%s' does not exist", subnet))
	}
	if err := f.takeAddress(subnet); err != nil {
		return nil, err
	}
	ud, err := base64.StdEncoding.DecodeString(awssdk.ToString(in.UserData))
	if err != nil {
		return nil, apiError("InvalidParameterValue", "Invalid BASE64 encoding of user data")
	}
	if len(ud) > 16<<10 {
		return nil, apiError("InvalidParameterValue", "User data is limited to 16384 bytes")
	}
	id := f.nextID("i")
	it := in.InstanceType
	if it == "" {
		it = types.InstanceTypeT3Micro
	}
	ip := fmt.Sprintf("10.0.%d.%d", f.seq/250, f.seq%250+4)
	inst := &instance{userData: ud, hidden: f.VisibleAfter}
	inst.Instance = types.Instance{
		InstanceId: awssdk.String(id), ImageId: awssdk.String(image), InstanceType: it,
		State:            &types.InstanceState{Code: awssdk.Int32(0), Name: types.InstanceStateNamePending},
		SubnetId:         in.SubnetId,
		Placement:        &types.Placement{AvailabilityZone: awssdk.String(Zone)},
		PrivateIpAddress: awssdk.String(ip),
		ClientToken:      in.ClientToken,
		LaunchTime:       awssdk.Time(time.Now().UTC()),
		KeyName:          in.KeyName,
		NetworkInterfaces: []types.InstanceNetworkInterface{{
			NetworkInterfaceId: awssdk.String(f.nextID("eni")), SubnetId: in.SubnetId,
			PrivateIpAddresses: []types.InstancePrivateIpAddress{{PrivateIpAddress: awssdk.String(ip), Primary: awssdk.Bool(true)}},
		}},
	}
	for _, sg := range in.SecurityGroupIds {
		inst.SecurityGroups = append(inst.SecurityGroups, types.GroupIdentifier{GroupId: awssdk.String(sg)})
	}
	for _, ts := range in.TagSpecifications {
		if ts.ResourceType == types.ResourceTypeInstance {
			inst.Tags = append(inst.Tags, ts.Tags...)
		}
	}
	if mo := in.InstanceMarketOptions; mo != nil && mo.MarketType == types.MarketTypeSpot {
		inst.InstanceLifecycle = types.InstanceLifecycleTypeSpot
		inst.SpotInstanceRequestId = awssdk.String(f.nextID("sir"))
	}
	f.instances[id] = inst
	f.order = append(f.order, id)
	if tok := awssdk.ToString(in.ClientToken); tok != "" {
		f.tokens[tok] = token{ec2ID: id, fingerprint: fp}
	}
	return &ec2.RunInstancesOutput{Instances: []types.Instance{inst.Instance}, ReservationId: awssdk.String(f.nextID("r"))}, f.leave(OpRunInstances)
}

// look advances an instance one step as a describe sees it: pending
// becomes running, shutting-down becomes terminated.
func (i *instance) look() {
	switch i.State.Name {
	case types.InstanceStateNamePending:
		i.State = &types.InstanceState{Code: awssdk.Int32(16), Name: types.InstanceStateNameRunning}
	case types.InstanceStateNameShuttingDown:
		i.State = &types.InstanceState{Code: awssdk.Int32(48), Name: types.InstanceStateNameTerminated}
	}
}

func (i *instance) matches(fs []types.Filter) (bool, error) {
	for _, flt := range fs {
		name := awssdk.ToString(flt.Name)
		var have string
		switch {
		case strings.HasPrefix(name, "tag:"):
			have = "\x00"
			for _, t := range i.Tags {
				if awssdk.ToString(t.Key) == name[4:] {
					have = awssdk.ToString(t.Value)
				}
			}
		case name == "instance-state-name":
			have = string(i.State.Name)
		case name == "instance-id":
			have = awssdk.ToString(i.InstanceId)
		case name == "private-ip-address":
			have = awssdk.ToString(i.PrivateIpAddress)
		default:
			return false, apiError("InvalidParameterValue", fmt.Sprintf("The filter '%s' is invalid (fake)", name))
		}
		ok := false
		for _, v := range flt.Values {
			ok = ok || v == have
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// DescribeInstances answers by InstanceIds (any unknown or not yet visible:
// InvalidInstanceID.NotFound) and Filters (tag:KEY, instance-state-name,
// instance-id, private-ip-address), one reservation per instance, paged by PageSize.
func (f *EC2) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDescribeInstances); err != nil {
		return nil, err
	}
	var ids []string
	if len(in.InstanceIds) > 0 {
		for _, id := range in.InstanceIds {
			i, ok := f.instances[id]
			if !ok || i.hidden > 0 {
				f.hideStep()
				return nil, apiError("InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
			}
		}
		ids = in.InstanceIds
	} else {
		ids = f.order
	}
	var out []types.Reservation
	for _, id := range ids {
		i := f.instances[id]
		if i.hidden > 0 {
			continue
		}
		i.look()
		ok, err := i.matches(in.Filters)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, types.Reservation{ReservationId: awssdk.String("r-" + id[2:]), Instances: []types.Instance{i.Instance}})
		}
	}
	f.hideStep()
	start := 0
	if t := awssdk.ToString(in.NextToken); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n > len(out) {
			return nil, apiError("InvalidParameterValue", "bad NextToken")
		}
		start = n
	}
	page := &ec2.DescribeInstancesOutput{Reservations: out[start:]}
	if f.PageSize > 0 && len(out)-start > f.PageSize {
		page.Reservations = out[start : start+f.PageSize]
		page.NextToken = awssdk.String(strconv.Itoa(start + f.PageSize))
	}
	return page, f.leave(OpDescribeInstances)
}

// hideStep counts one describe against every hidden instance.
func (f *EC2) hideStep() {
	for _, i := range f.instances {
		if i.hidden > 0 {
			i.hidden--
		}
	}
}

// TerminateInstances moves instances to shutting-down (terminated at the
// next look) and detaches their network interfaces.
func (f *EC2) TerminateInstances(_ context.Context, in *ec2.TerminateInstancesInput, _ ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpTerminateInstances); err != nil {
		return nil, err
	}
	for _, id := range in.InstanceIds {
		if _, ok := f.instances[id]; !ok {
			return nil, apiError("InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
		}
	}
	out := &ec2.TerminateInstancesOutput{}
	for _, id := range in.InstanceIds {
		i := f.instances[id]
		prev := i.State
		if i.State.Name != types.InstanceStateNameTerminated {
			i.State = &types.InstanceState{Code: awssdk.Int32(32), Name: types.InstanceStateNameShuttingDown}
			i.StateReason = &types.StateReason{Code: awssdk.String("Client.UserInitiatedShutdown"), Message: awssdk.String("Client.UserInitiatedShutdown: User initiated shutdown")}
		}
		out.TerminatingInstances = append(out.TerminatingInstances, types.InstanceStateChange{InstanceId: awssdk.String(id), PreviousState: prev, CurrentState: i.State})
		for _, e := range f.enis {
			if e.Attachment != nil && awssdk.ToString(e.Attachment.InstanceId) == id {
				e.Attachment, e.Status = nil, types.NetworkInterfaceStatusAvailable
			}
		}
	}
	return out, f.leave(OpTerminateInstances)
}

// Interrupt reclaims a spot instance the way EC2 does: terminated with the
// spot termination reason.
func (f *EC2) Interrupt(ec2ID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.instances[ec2ID]
	if !ok || i.InstanceLifecycle != types.InstanceLifecycleTypeSpot {
		return fmt.Errorf("fake: %s is not a spot instance", ec2ID)
	}
	i.State = &types.InstanceState{Code: awssdk.Int32(48), Name: types.InstanceStateNameTerminated}
	i.StateReason = &types.StateReason{Code: awssdk.String("Server.SpotInstanceTermination"), Message: awssdk.String("Server.SpotInstanceTermination: Spot instance termination")}
	return nil
}

// ShowAll makes every instance visible to DescribeInstances now.
func (f *EC2) ShowAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, i := range f.instances {
		i.hidden = 0
	}
}

// SetState forces an instance's state (e.g. stopped).
func (f *EC2) SetState(ec2ID string, name types.InstanceStateName) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.instances[ec2ID]
	if !ok {
		return fmt.Errorf("fake: no instance %s", ec2ID)
	}
	i.State = &types.InstanceState{Name: name}
	return nil
}

// Instance is the fake's record of one instance.
type Instance struct {
	types.Instance
	// UserData is the decoded user data.
	UserData []byte
}

// Instances returns every instance ever launched (terminated ones too), in
// launch order.
func (f *EC2) Instances() []Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Instance, 0, len(f.order))
	for _, id := range f.order {
		i := f.instances[id]
		out = append(out, Instance{Instance: i.Instance, UserData: i.userData})
	}
	return out
}

// AddNetworkInterface creates an available ENI in subnet and returns its id.
func (f *EC2) AddNetworkInterface(subnet, ip string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.nextID("eni")
	f.enis[id] = &eni{NetworkInterface: types.NetworkInterface{
		NetworkInterfaceId: awssdk.String(id), SubnetId: awssdk.String(subnet), AvailabilityZone: awssdk.String(Zone),
		PrivateIpAddress: awssdk.String(ip), Status: types.NetworkInterfaceStatusAvailable, InterfaceType: types.NetworkInterfaceTypeInterface,
	}}
	return id
}

// AttachedTo returns the instance an ENI is attached to and the
// attachment status ("" when detached).
func (f *EC2) AttachedTo(eniID string) (instanceID string, status types.AttachmentStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.enis[eniID]
	if !ok || e.Attachment == nil {
		return "", ""
	}
	return awssdk.ToString(e.Attachment.InstanceId), e.Attachment.Status
}

// look settles an attachment one step.
func (e *eni) look() {
	if e.Attachment == nil {
		return
	}
	if e.settle > 0 {
		e.settle--
		return
	}
	switch e.Attachment.Status {
	case types.AttachmentStatusAttaching:
		e.Attachment.Status = types.AttachmentStatusAttached
	case types.AttachmentStatusDetaching:
		e.Attachment, e.Status = nil, types.NetworkInterfaceStatusAvailable
	}
}

// DescribeNetworkInterfaces answers by NetworkInterfaceIds only.
func (f *EC2) DescribeNetworkInterfaces(_ context.Context, in *ec2.DescribeNetworkInterfacesInput, _ ...func(*ec2.Options)) (*ec2.DescribeNetworkInterfacesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDescribeNetworkInterfaces); err != nil {
		return nil, err
	}
	if len(in.Filters) > 0 || len(in.NetworkInterfaceIds) == 0 {
		return nil, apiError("InvalidParameterValue", "fake describes network interfaces by id only")
	}
	out := &ec2.DescribeNetworkInterfacesOutput{}
	ids := append([]string(nil), in.NetworkInterfaceIds...)
	sort.Strings(ids)
	for _, id := range ids {
		e, ok := f.enis[id]
		if !ok {
			return nil, apiError("InvalidNetworkInterfaceID.NotFound", fmt.Sprintf("The networkInterface ID '%s' does not exist", id))
		}
		e.look()
		ni := e.NetworkInterface
		if e.Attachment != nil {
			a := *e.Attachment
			ni.Attachment = &a
		}
		out.NetworkInterfaces = append(out.NetworkInterfaces, ni)
	}
	return out, f.leave(OpDescribeNetworkInterfaces)
}

// AttachNetworkInterface attaches an available ENI to a running instance
// (attaching, attached after SettleAfter looks).
func (f *EC2) AttachNetworkInterface(_ context.Context, in *ec2.AttachNetworkInterfaceInput, _ ...func(*ec2.Options)) (*ec2.AttachNetworkInterfaceOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpAttachNetworkInterface); err != nil {
		return nil, err
	}
	e, ok := f.enis[awssdk.ToString(in.NetworkInterfaceId)]
	if !ok {
		return nil, apiError("InvalidNetworkInterfaceID.NotFound", fmt.Sprintf("The networkInterface ID '%s' does not exist", awssdk.ToString(in.NetworkInterfaceId)))
	}
	i, ok := f.instances[awssdk.ToString(in.InstanceId)]
	if !ok {
		return nil, apiError("InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", awssdk.ToString(in.InstanceId)))
	}
	if i.State.Name != types.InstanceStateNameRunning && i.State.Name != types.InstanceStateNameStopped {
		return nil, apiError("IncorrectInstanceState", fmt.Sprintf("The instance '%s' is not in a valid state for this operation", awssdk.ToString(in.InstanceId)))
	}
	if e.Attachment != nil {
		return nil, apiError("InvalidParameterValue", fmt.Sprintf("Interface: [%s] in use.", awssdk.ToString(in.NetworkInterfaceId)))
	}
	if in.DeviceIndex == nil {
		return nil, apiError("MissingParameter", "The request must contain the parameter deviceIndex")
	}
	for _, o := range f.enis {
		if a := o.Attachment; a != nil && awssdk.ToString(a.InstanceId) == awssdk.ToString(in.InstanceId) && awssdk.ToInt32(a.DeviceIndex) == *in.DeviceIndex {
			return nil, apiError("InvalidParameterValue", fmt.Sprintf("Instance '%s' already has an interface attached at device index '%d'.", awssdk.ToString(in.InstanceId), *in.DeviceIndex))
		}
	}
	att := f.nextID("eni-attach")
	e.Attachment = &types.NetworkInterfaceAttachment{AttachmentId: awssdk.String(att), InstanceId: in.InstanceId,
		DeviceIndex: in.DeviceIndex, Status: types.AttachmentStatusAttaching, AttachTime: awssdk.Time(time.Now().UTC())}
	e.Status, e.settle = types.NetworkInterfaceStatusInUse, f.SettleAfter
	return &ec2.AttachNetworkInterfaceOutput{AttachmentId: awssdk.String(att), NetworkCardIndex: awssdk.Int32(0)}, f.leave(OpAttachNetworkInterface)
}

// DetachNetworkInterface starts detaching (available after SettleAfter
// looks); a non-forced detach of an attachment already detaching is a no-op.
func (f *EC2) DetachNetworkInterface(_ context.Context, in *ec2.DetachNetworkInterfaceInput, _ ...func(*ec2.Options)) (*ec2.DetachNetworkInterfaceOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDetachNetworkInterface); err != nil {
		return nil, err
	}
	for _, e := range f.enis {
		if a := e.Attachment; a != nil && awssdk.ToString(a.AttachmentId) == awssdk.ToString(in.AttachmentId) {
			a.Status, e.settle = types.AttachmentStatusDetaching, f.SettleAfter
			if awssdk.ToBool(in.Force) {
				e.settle = 0
			}
			return &ec2.DetachNetworkInterfaceOutput{}, f.leave(OpDetachNetworkInterface)
		}
	}
	return nil, apiError("InvalidAttachmentID.NotFound", fmt.Sprintf("The attachment ID '%s' does not exist", awssdk.ToString(in.AttachmentId)))
}
