// Package fake is a stateful, in-process Compute Engine for tests of the
// gcp provider, its alias IP leader address and the gcp load balancer
// kind: it implements gcp.API with instances (names, labels, metadata,
// status, spot scheduling), instance templates, reserved internal
// addresses and the alias IP ranges that use them (with interface
// fingerprints), and unmanaged instance groups. It checks requests as
// Compute Engine does (name and label rules, an image or a template, a
// machine type, a fingerprint that matches, an address used once) and
// injects failures (Fail). Spot preemption is Preempt; MetadataHandler
// serves an instance's metadata server view of it to the agent.
package fake

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
)

// Project is the project the fake's resource URLs name.
const Project = "fake-project"

// Compute is the fake. Create it with New.
type Compute struct {
	mu sync.Mutex
	// Provisioning: a new instance stays PROVISIONING for this many reads
	// (gets and lists) before it is RUNNING.
	Provisioning int

	seq       int
	instances map[string]*instance // zone/name
	templates map[string]*computepb.InstanceProperties
	addresses map[string]*computepb.Address // region/name
	groups    map[string]map[string]bool    // zone/name -> instance URLs
	fail      map[string][]int
	lose      map[string]int
	calls     map[string]int
	inserts   []*computepb.InsertInstanceRequest
}

type instance struct {
	inst      *computepb.Instance
	reads     int
	preempted bool
}

// New returns an empty fake.
func New() *Compute {
	return &Compute{instances: map[string]*instance{}, templates: map[string]*computepb.InstanceProperties{},
		addresses: map[string]*computepb.Address{}, groups: map[string]map[string]bool{}, fail: map[string][]int{}, lose: map[string]int{}, calls: map[string]int{}}
}

// InstanceURL is the self link of an instance.
func InstanceURL(zone, name string) string {
	return fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s/instances/%s", Project, zone, name)
}

// Fail makes the next calls of method (an API method name, e.g.
// "InsertInstance") fail with the given HTTP statuses, one each, before
// they do anything.
func (f *Compute) Fail(method string, codes ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = append(f.fail[method], codes...)
}

// LoseResponses makes the next n calls of method take effect and then
// fail with 503, as an answer lost after Compute Engine committed does.
func (f *Compute) LoseResponses(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lose[method] += n
}

// lost reports (and counts down) a response to lose. Holds mu.
func (f *Compute) lost(method string, err error) error {
	if err == nil && f.lose[method] > 0 {
		f.lose[method]--
		return gcp.NewError(http.StatusServiceUnavailable, "injected lost answer of "+method)
	}
	return err
}

// Calls returns how often method was called.
func (f *Compute) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Inserts returns the insert requests received, in order.
func (f *Compute) Inserts() []*computepb.InsertInstanceRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*computepb.InsertInstanceRequest, len(f.inserts))
	for i, r := range f.inserts {
		out[i] = proto.CloneOf(r)
	}
	return out
}

// begin counts a call and returns an injected failure, if any. Holds mu.
func (f *Compute) begin(method string) error {
	f.calls[method]++
	if codes := f.fail[method]; len(codes) > 0 {
		f.fail[method] = codes[1:]
		return gcp.NewError(codes[0], "injected failure of "+method)
	}
	return nil
}

// AddTemplate adds an instance template (its name as global/instanceTemplates/NAME).
func (f *Compute) AddTemplate(name string, props *computepb.InstanceProperties) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.templates["global/instanceTemplates/"+name] = proto.CloneOf(props)
}

// AddAddress reserves an internal address in region.
func (f *Compute) AddAddress(region, name, ip string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addresses[region+"/"+name] = &computepb.Address{Name: proto.String(name), Address: proto.String(ip),
		AddressType: proto.String("INTERNAL"), Status: proto.String("RESERVED")}
}

// AddGroup creates an empty unmanaged instance group in zone.
func (f *Compute) AddGroup(zone, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[zone+"/"+name] = map[string]bool{}
}

// GroupMembers returns the instance URLs of a group, sorted.
func (f *Compute) GroupMembers(zone, name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for u := range f.groups[zone+"/"+name] {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// PutInstance adds an instance as is (a machine created by hand or by
// another cluster); its zone is the last part of inst.Zone.
func (f *Compute) PutInstance(zone string, inst *computepb.Instance) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inst = proto.CloneOf(inst)
	inst.Zone = proto.String(zone)
	inst.SelfLink = proto.String(InstanceURL(zone, inst.GetName()))
	if inst.Status == nil {
		inst.Status = proto.String("RUNNING")
	}
	f.instances[zone+"/"+inst.GetName()] = &instance{inst: inst}
}

// Instances returns copies of every instance, sorted by zone and name.
func (f *Compute) Instances() []*computepb.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.instances))
	for k := range f.instances {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*computepb.Instance, len(keys))
	for i, k := range keys {
		out[i] = proto.CloneOf(f.instances[k].inst)
	}
	return out
}

// SetStatus sets an instance's status (e.g. STOPPED, TERMINATED).
func (f *Compute) SetStatus(zone, name, status string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i := f.instances[zone+"/"+name]; i != nil {
		i.inst.Status = proto.String(status)
	}
}

// Preempt starts the preemption of a spot instance: its metadata server
// says preempted (MetadataHandler) while it still runs its 30s of grace;
// Reclaim ends it.
func (f *Compute) Preempt(zone, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.instances[zone+"/"+name]
	if i == nil {
		return fmt.Errorf("no instance %s/%s", zone, name)
	}
	if i.inst.GetScheduling().GetProvisioningModel() != gcp.ProvisioningSpot {
		return fmt.Errorf("instance %s/%s is not spot", zone, name)
	}
	i.preempted = true
	return nil
}

// Reclaim finishes a preemption: the instance is deleted (its
// termination action) or TERMINATED.
func (f *Compute) Reclaim(zone, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.instances[zone+"/"+name]
	if i == nil {
		return
	}
	if i.inst.GetScheduling().GetInstanceTerminationAction() == "DELETE" {
		f.remove(zone + "/" + name)
		return
	}
	i.inst.Status = proto.String("TERMINATED")
}

// MetadataHandler serves the metadata server of instance zone/name as the
// agent reads it: instance/preempted (TRUE/FALSE) and
// instance/scheduling/provisioning-model, with the Metadata-Flavor header
// required.
func (f *Compute) MetadataHandler(zone, name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "missing Metadata-Flavor: Google", http.StatusForbidden)
			return
		}
		f.mu.Lock()
		i := f.instances[zone+"/"+name]
		var preempted bool
		var model string
		if i != nil {
			preempted, model = i.preempted, i.inst.GetScheduling().GetProvisioningModel()
		}
		f.mu.Unlock()
		if model == "" {
			model = gcp.ProvisioningStandard
		}
		w.Header().Set("Metadata-Flavor", "Google")
		w.Header().Set("Content-Type", "application/text")
		switch r.URL.Path {
		case "/computeMetadata/v1/instance/preempted":
			_, _ = fmt.Fprint(w, strings.ToUpper(strconv.FormatBool(preempted)))
		case "/computeMetadata/v1/instance/scheduling/provisioning-model":
			_, _ = fmt.Fprint(w, model)
		default:
			http.NotFound(w, r)
		}
	})
}

var (
	nameRE     = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	labelKeyRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	labelValRE = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
)

func badRequest(format string, args ...any) error {
	return gcp.NewError(http.StatusBadRequest, fmt.Sprintf(format, args...))
}

// InsertInstance implements gcp.API.
func (f *Compute) InsertInstance(_ context.Context, req *computepb.InsertInstanceRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("InsertInstance"); err != nil {
		return err
	}
	f.inserts = append(f.inserts, proto.CloneOf(req))
	in := req.GetInstanceResource()
	name, zone := in.GetName(), req.GetZone()
	if !nameRE.MatchString(name) {
		return badRequest("Invalid value for field 'resource.name': %q", name)
	}
	for k, v := range in.GetLabels() {
		if !labelKeyRE.MatchString(k) || !labelValRE.MatchString(v) {
			return badRequest("Invalid value for field 'resource.labels': %q=%q", k, v)
		}
	}
	if len(in.GetLabels()) > 64 {
		return badRequest("too many labels")
	}
	size := 0
	for _, it := range in.GetMetadata().GetItems() {
		size += len(it.GetKey()) + len(it.GetValue())
		if len(it.GetValue()) > 256<<10 {
			return badRequest("metadata value %s too large", it.GetKey())
		}
	}
	if size > 512<<10 {
		return badRequest("metadata too large")
	}
	if _, ok := f.instances[zone+"/"+name]; ok {
		return gcp.NewError(http.StatusConflict, fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", Project, zone, name))
	}
	inst := proto.CloneOf(in)
	if t := req.GetSourceInstanceTemplate(); t != "" {
		props, ok := f.templates[t]
		if !ok {
			return gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource '%s' was not found", t))
		}
		if inst.MachineType == nil && props.MachineType != nil {
			inst.MachineType = proto.String("zones/" + zone + "/machineTypes/" + props.GetMachineType())
		}
		if len(inst.Disks) == 0 {
			inst.Disks = props.GetDisks()
		}
		if inst.Scheduling == nil {
			inst.Scheduling = props.GetScheduling()
		}
		if len(inst.NetworkInterfaces) == 0 {
			inst.NetworkInterfaces = props.GetNetworkInterfaces()
		}
	}
	if len(inst.Disks) == 0 {
		return badRequest("Invalid value for field 'resource.disks': no boot disk")
	}
	if !strings.HasPrefix(inst.GetMachineType(), "zones/"+zone+"/machineTypes/") {
		return badRequest("Invalid value for field 'resource.machineType': %q", inst.GetMachineType())
	}
	if len(inst.NetworkInterfaces) == 0 {
		inst.NetworkInterfaces = []*computepb.NetworkInterface{{Subnetwork: proto.String("regions/default/subnetworks/default")}}
	}
	f.seq++
	for n, ni := range inst.NetworkInterfaces {
		ni.Name = proto.String(fmt.Sprintf("nic%d", n))
		ni.NetworkIP = proto.String(fmt.Sprintf("10.%d.%d.%d", n, f.seq/250, 2+f.seq%250))
		ni.Fingerprint = proto.String("fp-" + strconv.Itoa(f.seq))
	}
	inst.Id = proto.Uint64(uint64(1000 + f.seq))
	inst.Zone = proto.String(zone)
	inst.SelfLink = proto.String(InstanceURL(zone, name))
	inst.Status = proto.String("RUNNING")
	i := &instance{inst: inst, reads: f.Provisioning}
	if i.reads > 0 {
		inst.Status = proto.String("PROVISIONING")
	}
	f.instances[zone+"/"+name] = i
	return f.lost("InsertInstance", nil)
}

// read advances a provisioning instance. Holds mu.
func (i *instance) read() *computepb.Instance {
	if i.reads > 0 {
		i.reads--
		if i.reads == 0 && i.inst.GetStatus() == "PROVISIONING" {
			i.inst.Status = proto.String("RUNNING")
		}
	}
	return proto.CloneOf(i.inst)
}

// GetInstance implements gcp.API.
func (f *Compute) GetInstance(_ context.Context, req *computepb.GetInstanceRequest) (*computepb.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("GetInstance"); err != nil {
		return nil, err
	}
	i := f.instances[req.GetZone()+"/"+req.GetInstance()]
	if i == nil {
		return nil, gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", req.GetProject(), req.GetZone(), req.GetInstance()))
	}
	return i.read(), nil
}

var termRE = regexp.MustCompile(`^\(labels\.([a-z][a-z0-9_-]*) = "([a-z0-9_-]*)"\)$`)

// matcher parses the filters the provider sends: terms
// `(labels.KEY = "VALUE")` joined by " AND ".
func matcher(filter string) (func(*computepb.Instance) bool, error) {
	if filter == "" {
		return func(*computepb.Instance) bool { return true }, nil
	}
	want := map[string]string{}
	for _, term := range strings.Split(filter, " AND ") {
		m := termRE.FindStringSubmatch(term)
		if m == nil {
			return nil, badRequest("Invalid list filter expression %q", filter)
		}
		want[m[1]] = m[2]
	}
	return func(i *computepb.Instance) bool {
		for k, v := range want {
			if got, ok := i.GetLabels()[k]; !ok || got != v {
				return false
			}
		}
		return true
	}, nil
}

// ListInstances implements gcp.API.
func (f *Compute) ListInstances(_ context.Context, req *computepb.ListInstancesRequest) ([]*computepb.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("ListInstances"); err != nil {
		return nil, err
	}
	match, err := matcher(req.GetFilter())
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(f.instances))
	for k := range f.instances {
		if strings.HasPrefix(k, req.GetZone()+"/") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []*computepb.Instance
	for _, k := range keys {
		if i := f.instances[k]; match(i.inst) {
			out = append(out, i.read())
		}
	}
	return out, nil
}

// remove deletes an instance, its alias ranges' address use and its group
// memberships. Holds mu.
func (f *Compute) remove(key string) {
	i := f.instances[key]
	delete(f.instances, key)
	if i == nil {
		return
	}
	for _, members := range f.groups {
		delete(members, i.inst.GetSelfLink())
	}
	f.users()
}

// DeleteInstance implements gcp.API.
func (f *Compute) DeleteInstance(_ context.Context, req *computepb.DeleteInstanceRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("DeleteInstance"); err != nil {
		return err
	}
	key := req.GetZone() + "/" + req.GetInstance()
	if f.instances[key] == nil {
		return gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", req.GetProject(), req.GetZone(), req.GetInstance()))
	}
	f.remove(key)
	return nil
}

// users recomputes every address's users and status from the alias
// ranges. Holds mu.
func (f *Compute) users() {
	for _, a := range f.addresses {
		a.Users, a.Status = nil, proto.String("RESERVED")
	}
	keys := make([]string, 0, len(f.instances))
	for k := range f.instances {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		i := f.instances[k]
		for _, ni := range i.inst.GetNetworkInterfaces() {
			for _, r := range ni.GetAliasIpRanges() {
				for _, a := range f.addresses {
					if a.GetAddress()+"/32" == r.GetIpCidrRange() {
						a.Users = append(a.Users, i.inst.GetSelfLink())
						a.Status = proto.String("IN_USE")
					}
				}
			}
		}
	}
}

// UpdateNetworkInterface implements gcp.API: only alias IP ranges change;
// the fingerprint must match, and a range may be on one instance only.
func (f *Compute) UpdateNetworkInterface(_ context.Context, req *computepb.UpdateNetworkInterfaceInstanceRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("UpdateNetworkInterface"); err != nil {
		return err
	}
	key := req.GetZone() + "/" + req.GetInstance()
	i := f.instances[key]
	if i == nil {
		return gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", req.GetProject(), req.GetZone(), req.GetInstance()))
	}
	var ni *computepb.NetworkInterface
	for _, n := range i.inst.GetNetworkInterfaces() {
		if n.GetName() == req.GetNetworkInterface() {
			ni = n
		}
	}
	if ni == nil {
		return badRequest("no network interface %q", req.GetNetworkInterface())
	}
	upd := req.GetNetworkInterfaceResource()
	if upd.GetFingerprint() != ni.GetFingerprint() {
		return gcp.NewError(http.StatusPreconditionFailed, "Supplied fingerprint does not match current fingerprint")
	}
	for _, r := range upd.GetAliasIpRanges() {
		for k, other := range f.instances {
			if k == key {
				continue
			}
			for _, on := range other.inst.GetNetworkInterfaces() {
				for _, or := range on.GetAliasIpRanges() {
					if or.GetIpCidrRange() == r.GetIpCidrRange() {
						return badRequest("IP range %s is already in use by %s", r.GetIpCidrRange(), other.inst.GetName())
					}
				}
			}
		}
	}
	f.seq++
	ni.AliasIpRanges = nil
	for _, r := range upd.GetAliasIpRanges() {
		ni.AliasIpRanges = append(ni.AliasIpRanges, proto.CloneOf(r))
	}
	ni.Fingerprint = proto.String("fp-" + strconv.Itoa(f.seq))
	f.users()
	return nil
}

// GetAddress implements gcp.API.
func (f *Compute) GetAddress(_ context.Context, req *computepb.GetAddressRequest) (*computepb.Address, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("GetAddress"); err != nil {
		return nil, err
	}
	a := f.addresses[req.GetRegion()+"/"+req.GetAddress()]
	if a == nil {
		return nil, gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/regions/%s/addresses/%s' was not found", req.GetProject(), req.GetRegion(), req.GetAddress()))
	}
	return proto.CloneOf(a), nil
}

func (f *Compute) group(zone, name string) (map[string]bool, error) {
	g, ok := f.groups[zone+"/"+name]
	if !ok {
		return nil, gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/instanceGroups/%s' was not found", Project, zone, name))
	}
	return g, nil
}

// instanceByURL finds an instance by its URL (full or relative). Holds mu.
func (f *Compute) instanceByURL(u string) *instance {
	zone, name, ok := gcp.ParseInstanceURL(u)
	if !ok {
		return nil
	}
	return f.instances[zone+"/"+name]
}

// AddInstances implements gcp.API: every instance must exist, be in the
// group's zone and not be a member yet (memberAlreadyExists).
func (f *Compute) AddInstances(_ context.Context, req *computepb.AddInstancesInstanceGroupRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("AddInstances"); err != nil {
		return err
	}
	g, err := f.group(req.GetZone(), req.GetInstanceGroup())
	if err != nil {
		return err
	}
	var add []string
	for _, r := range req.GetInstanceGroupsAddInstancesRequestResource().GetInstances() {
		i := f.instanceByURL(r.GetInstance())
		if i == nil {
			return gcp.NewError(http.StatusNotFound, fmt.Sprintf("The resource '%s' was not found", r.GetInstance()))
		}
		if i.inst.GetZone() != req.GetZone() {
			return badRequest("instance %s is not in zone %s", r.GetInstance(), req.GetZone())
		}
		if g[i.inst.GetSelfLink()] {
			return badRequest("memberAlreadyExists: %s", r.GetInstance())
		}
		add = append(add, i.inst.GetSelfLink())
	}
	for _, u := range add {
		g[u] = true
	}
	return nil
}

// RemoveInstances implements gcp.API: removing a non-member is an error
// (memberNotFound), as in Compute Engine.
func (f *Compute) RemoveInstances(_ context.Context, req *computepb.RemoveInstancesInstanceGroupRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("RemoveInstances"); err != nil {
		return err
	}
	g, err := f.group(req.GetZone(), req.GetInstanceGroup())
	if err != nil {
		return err
	}
	var del []string
	for _, r := range req.GetInstanceGroupsRemoveInstancesRequestResource().GetInstances() {
		zone, name, ok := gcp.ParseInstanceURL(r.GetInstance())
		u := InstanceURL(zone, name)
		if !ok || !g[u] {
			return badRequest("memberNotFound: %s", r.GetInstance())
		}
		del = append(del, u)
	}
	for _, u := range del {
		delete(g, u)
	}
	return nil
}

// ListGroupInstances implements gcp.API.
func (f *Compute) ListGroupInstances(_ context.Context, req *computepb.ListInstancesInstanceGroupsRequest) ([]*computepb.InstanceWithNamedPorts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("ListGroupInstances"); err != nil {
		return nil, err
	}
	g, err := f.group(req.GetZone(), req.GetInstanceGroup())
	if err != nil {
		return nil, err
	}
	urls := make([]string, 0, len(g))
	for u := range g {
		urls = append(urls, u)
	}
	sort.Strings(urls)
	out := make([]*computepb.InstanceWithNamedPorts, 0, len(urls))
	for _, u := range urls {
		st := "RUNNING"
		if i := f.instanceByURL(u); i != nil {
			st = i.inst.GetStatus()
		}
		out = append(out, &computepb.InstanceWithNamedPorts{Instance: proto.String(u), Status: proto.String(st)})
	}
	return out, nil
}

var _ gcp.API = (*Compute)(nil)
