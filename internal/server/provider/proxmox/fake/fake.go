// Package fake is a stateful in-memory Proxmox VE cluster behind the
// proxmox provider's API interface: nodes with memory, template and
// cloned VMs with tags and configuration, ISO volumes per node and
// storage, and tasks (UPIDs) that finish after a set number of looks. It
// refuses what Proxmox VE refuses where the provider could get it wrong: a
// VMID taken twice, a clone of a VM that is not there, tags outside the
// tag syntax, a CD-ROM naming a missing ISO, destroying a running VM, a
// task that does not exist.
package fake

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
)

// DefaultNodeMemory is each node's memory (64 GiB).
const DefaultNodeMemory = 64 << 30

// VMState is one VM of the fake.
type VMState struct {
	VMID        int
	Node        string
	Name        string
	Description string
	Status      string
	Template    bool
	Tags        []string
	// Options are the other configuration keys (cores, memory, ide3, ...).
	Options map[string]string
	// ClonedFrom is the template's VMID (0: not a clone).
	ClonedFrom int
}

type node struct {
	online bool
	maxMem uint64
}

type task struct {
	looks int
	exit  string
}

// Fake is the in-memory cluster. Safe for concurrent use.
type Fake struct {
	// TaskLooks is how many status looks a task answers "running" before
	// "stopped" (default 0: finished at the first look).
	TaskLooks int
	// Fail, when set, is asked before every call (its API method name and
	// the VMID or file it is about); an error it returns is the call's.
	Fail func(method, subject string) error
	// FailTask, when set, is asked when a task is made (its type:
	// qmclone, qmconfig, qmstart, qmstop, qmdestroy, imgcopy, imgdel); a
	// non-empty answer is the task's exit status instead of OK.
	FailTask func(kind string, vmid int) string

	mu      sync.Mutex
	nodes   map[string]*node
	vms     map[int]*VMState
	volumes map[string][]byte // node/volid
	tasks   map[string]*task
	nextID  int
	seq     int
	calls   map[string]int
}

var _ proxmox.API = (*Fake)(nil)

// New returns a cluster of the named nodes, each online with
// DefaultNodeMemory.
func New(nodes ...string) *Fake {
	f := &Fake{nodes: map[string]*node{}, vms: map[int]*VMState{}, volumes: map[string][]byte{}, tasks: map[string]*task{},
		nextID: 100, calls: map[string]int{}}
	for _, n := range nodes {
		f.nodes[n] = &node{online: true, maxMem: DefaultNodeMemory}
	}
	return f
}

// AddTemplate adds a template VM (memory in MiB) on node.
func (f *Fake) AddTemplate(nodeName string, vmid int, name string, memMiB int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vms[vmid] = &VMState{VMID: vmid, Node: nodeName, Name: name, Status: "stopped", Template: true,
		Options: map[string]string{"memory": strconv.Itoa(memMiB), "cores": "1", "scsi0": "local-lvm:base-" + strconv.Itoa(vmid) + "-disk-0"}}
}

// AddVM adds a VM nobody made through the API (a stranger, or one a
// crash left behind).
func (f *Fake) AddVM(v VMState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v.Options == nil {
		v.Options = map[string]string{}
	}
	f.vms[v.VMID] = &v
}

// SetOnline brings a node up or down.
func (f *Fake) SetOnline(nodeName string, online bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[nodeName].online = online
}

// SetNodeMemory sets a node's memory in bytes.
func (f *Fake) SetNodeMemory(nodeName string, maxMem uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[nodeName].maxMem = maxMem
}

// PowerOff stops a VM as its guest shutting down would.
func (f *Fake) PowerOff(vmid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.vms[vmid]; ok {
		v.Status = "stopped"
	}
}

// VMs returns copies of every VM, by VMID.
func (f *Fake) VMs() []VMState {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]VMState, 0, len(f.vms))
	for _, v := range f.vms {
		c := *v
		c.Tags = append([]string(nil), v.Tags...)
		c.Options = map[string]string{}
		for k, o := range v.Options {
			c.Options[k] = o
		}
		out = append(out, c)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].VMID < out[b].VMID })
	return out
}

// Volume returns an uploaded volume (storage:iso/name) on a node.
func (f *Fake) Volume(nodeName, volid string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.volumes[nodeName+"/"+volid]
	return b, ok
}

// Volumes returns the node/volid keys of every volume, sorted.
func (f *Fake) Volumes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.volumes))
	for k := range f.volumes {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Calls returns how often each API method was called.
func (f *Fake) Calls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

// call counts a call and asks Fail (without f.mu held: Fail may change
// the fake, as another client would between two calls).
func (f *Fake) call(method, subject string) error {
	f.mu.Lock()
	f.calls[method]++
	fail := f.Fail
	f.mu.Unlock()
	if fail != nil {
		return fail(method, subject)
	}
	return nil
}

// newTask records a task of kind on nodeName; f.mu is held.
func (f *Fake) newTask(nodeName, kind string, vmid int) string {
	f.seq++
	id := ""
	if vmid > 0 {
		id = strconv.Itoa(vmid)
	}
	upid := fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:nstance@pve!server:", nodeName, 4000+f.seq, 100000+f.seq, 1764200000+f.seq, kind, id)
	exit := "OK"
	if f.FailTask != nil {
		if e := f.FailTask(kind, vmid); e != "" {
			exit = e
		}
	}
	f.tasks[upid] = &task{looks: f.TaskLooks, exit: exit}
	return upid
}

func (f *Fake) vm(nodeName string, vmid int) (*VMState, error) {
	v, ok := f.vms[vmid]
	if !ok || v.Node != nodeName {
		return nil, fmt.Errorf("500 Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", nodeName, vmid)
	}
	return v, nil
}

func (f *Fake) memMiB(v *VMState) uint64 {
	m, _ := strconv.ParseUint(v.Options["memory"], 10, 64)
	if m == 0 {
		m = 512
	}
	return m
}

// Resources implements proxmox.API.
func (f *Fake) Resources(context.Context) ([]proxmox.VM, error) {
	if err := f.call("Resources", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]proxmox.VM, 0, len(f.vms))
	for _, v := range f.vms {
		out = append(out, proxmox.VM{VMID: v.VMID, Node: v.Node, Name: v.Name, Status: v.Status, Tags: append([]string(nil), v.Tags...),
			Template: v.Template, MaxMem: f.memMiB(v) << 20})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].VMID < out[b].VMID })
	return out, nil
}

// Nodes implements proxmox.API: a node's used memory is its running VMs'.
func (f *Fake) Nodes(context.Context) ([]proxmox.Node, error) {
	if err := f.call("Nodes", ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	used := map[string]uint64{}
	for _, v := range f.vms {
		if v.Status == "running" {
			used[v.Node] += f.memMiB(v) << 20
		}
	}
	out := make([]proxmox.Node, 0, len(f.nodes))
	for name, n := range f.nodes {
		out = append(out, proxmox.Node{Name: name, Online: n.online, MaxMem: n.maxMem, Mem: used[name]})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// NextID implements proxmox.API: the lowest free VMID from 100.
func (f *Fake) NextID(context.Context) (int, error) {
	if err := f.call("NextID", ""); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := 100
	for f.vms[id] != nil {
		id++
	}
	return id, nil
}

// Config implements proxmox.API.
func (f *Fake) Config(_ context.Context, nodeName string, vmid int) (proxmox.VMConfig, error) {
	if err := f.call("Config", strconv.Itoa(vmid)); err != nil {
		return proxmox.VMConfig{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, err := f.vm(nodeName, vmid)
	if err != nil {
		return proxmox.VMConfig{}, err
	}
	c := proxmox.VMConfig{Name: v.Name, Description: v.Description, Tags: append([]string(nil), v.Tags...), Options: map[string]string{}}
	for k, o := range v.Options {
		c.Options[k] = o
	}
	return c, nil
}

var dnsName = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?$`)

// Clone implements proxmox.API.
func (f *Fake) Clone(_ context.Context, nodeName string, vmid int, o proxmox.CloneOptions) (string, error) {
	return f.onVM("Clone", nodeName, vmid, func(src *VMState) (string, error) {
		if o.NewID < 100 {
			return "", fmt.Errorf("400 bad request: newid: value must have a minimum value of 100")
		}
		if _, taken := f.vms[o.NewID]; taken {
			return "", fmt.Errorf("500 unable to create VM %d: config file already exists", o.NewID)
		}
		if o.Name != "" && !dnsName.MatchString(o.Name) {
			return "", fmt.Errorf("400 bad request: name: value does not look like a valid DNS name")
		}
		target := nodeName
		if o.Target != "" {
			if _, ok := f.nodes[o.Target]; !ok {
				return "", fmt.Errorf("400 bad request: target: no such cluster node '%s'", o.Target)
			}
			target = o.Target
		}
		if !src.Template && !o.Full {
			return "", fmt.Errorf("500 linked clone feature is not supported for drive 'scsi0' (not a template)")
		}
		c := &VMState{VMID: o.NewID, Node: target, Name: o.Name, Description: o.Description, Status: "stopped", Tags: append([]string(nil), src.Tags...),
			Options: map[string]string{}, ClonedFrom: vmid}
		for k, v := range src.Options {
			c.Options[k] = v
		}
		f.vms[o.NewID] = c
		return f.newTask(nodeName, "qmclone", vmid), nil
	})
}

var tagPattern = regexp.MustCompile(`(?i)^[a-z0-9_][a-z0-9_+.-]*$`)

// SetConfig implements proxmox.API.
func (f *Fake) SetConfig(_ context.Context, nodeName string, vmid int, opts ...proxmox.ConfigOption) (string, error) {
	return f.onVM("SetConfig", nodeName, vmid, func(v *VMState) (string, error) {
		for _, o := range opts {
			switch {
			case o.Name == "tags":
				for _, t := range proxmox.SplitTags(o.Value) {
					if !tagPattern.MatchString(t) {
						return "", fmt.Errorf("400 bad request: tags: invalid format - invalid tag %q", t)
					}
				}
			case strings.HasPrefix(o.Name, "ide") || strings.HasPrefix(o.Name, "sata") || strings.HasPrefix(o.Name, "scsi"):
				vol, rest, _ := strings.Cut(o.Value, ",")
				if strings.Contains(rest, "media=cdrom") && vol != "none" {
					if _, ok := f.volumes[nodeName+"/"+vol]; !ok {
						return "", fmt.Errorf("400 bad request: %s: volume '%s' does not exist", o.Name, vol)
					}
				}
			case o.Name == "cores" || o.Name == "memory":
				if n, err := strconv.Atoi(o.Value); err != nil || n < 1 {
					return "", fmt.Errorf("400 bad request: %s: type check ('integer') failed - got '%s'", o.Name, o.Value)
				}
			}
		}
		for _, o := range opts {
			switch o.Name {
			case "tags":
				v.Tags = proxmox.SplitTags(o.Value)
			case "name":
				v.Name = o.Value
			case "description":
				v.Description = o.Value
			default:
				v.Options[o.Name] = o.Value
			}
		}
		return f.newTask(nodeName, "qmconfig", vmid), nil
	})
}

// Start implements proxmox.API.
func (f *Fake) Start(_ context.Context, nodeName string, vmid int) (string, error) {
	return f.vmTask("Start", "qmstart", nodeName, vmid, func(v *VMState) error {
		if v.Template {
			return fmt.Errorf("500 you can't start a vm if it's a template")
		}
		for k, o := range v.Options {
			if vol, rest, _ := strings.Cut(o, ","); strings.Contains(rest, "media=cdrom") && vol != "none" {
				if _, ok := f.volumes[nodeName+"/"+vol]; !ok {
					return fmt.Errorf("500 %s: volume '%s' does not exist", k, vol)
				}
			}
		}
		return nil
	}, func(v *VMState) { v.Status = "running" })
}

// Stop implements proxmox.API.
func (f *Fake) Stop(_ context.Context, nodeName string, vmid int) (string, error) {
	return f.vmTask("Stop", "qmstop", nodeName, vmid, nil, func(v *VMState) { v.Status = "stopped" })
}

// Destroy implements proxmox.API.
func (f *Fake) Destroy(_ context.Context, nodeName string, vmid int) (string, error) {
	return f.vmTask("Destroy", "qmdestroy", nodeName, vmid, func(v *VMState) error {
		if v.Status == "running" {
			return fmt.Errorf("500 VM %d is running - destroy failed", vmid)
		}
		return nil
	}, func(*VMState) { delete(f.vms, vmid) })
}

// vmTask is a power or destroy call on one VM: the call is recorded (and
// may be failed), refuse (optional) checks the VM as Proxmox would before
// it starts a task, and done applies the task's effect when it ends OK.
func (f *Fake) vmTask(method, kind, nodeName string, vmid int, refuse func(*VMState) error, done func(*VMState)) (string, error) {
	return f.onVM(method, nodeName, vmid, func(v *VMState) (string, error) {
		if refuse != nil {
			if err := refuse(v); err != nil {
				return "", err
			}
		}
		upid := f.newTask(nodeName, kind, vmid)
		if f.tasks[upid].exit == "OK" {
			done(v)
		}
		return upid, nil
	})
}

// onVM is a call on one existing VM: recorded (and possibly failed), then
// fn runs with the VM under f.mu.
func (f *Fake) onVM(method, nodeName string, vmid int, fn func(*VMState) (string, error)) (string, error) {
	if err := f.call(method, strconv.Itoa(vmid)); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, err := f.vm(nodeName, vmid)
	if err != nil {
		return "", err
	}
	return fn(v)
}

// Upload implements proxmox.API (an existing file is replaced).
func (f *Fake) Upload(_ context.Context, nodeName, storage, filename string, body []byte) (string, error) {
	if err := f.call("Upload", filename); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.nodes[nodeName]; !ok {
		return "", fmt.Errorf("500 no such node %q", nodeName)
	}
	if !strings.HasSuffix(filename, ".iso") || strings.ContainsAny(filename, "/:") {
		return "", fmt.Errorf("400 bad request: filename: wrong file extension")
	}
	f.volumes[nodeName+"/"+storage+":iso/"+filename] = append([]byte(nil), body...)
	return f.newTask(nodeName, "imgcopy", 0), nil
}

// DeleteVolume implements proxmox.API.
func (f *Fake) DeleteVolume(_ context.Context, nodeName, storage, volume string) (string, error) {
	if err := f.call("DeleteVolume", volume); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	key := nodeName + "/" + volume
	if !strings.HasPrefix(volume, storage+":") {
		return "", fmt.Errorf("500 volume %s is not on storage %s", volume, storage)
	}
	if _, ok := f.volumes[key]; !ok {
		return "", fmt.Errorf("500 volume %s does not exist", volume)
	}
	delete(f.volumes, key)
	return f.newTask(nodeName, "imgdel", 0), nil
}

// TaskStatus implements proxmox.API.
func (f *Fake) TaskStatus(_ context.Context, upid string) (proxmox.TaskStatus, error) {
	if err := f.call("TaskStatus", upid); err != nil {
		return proxmox.TaskStatus{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tasks[upid]
	if !ok {
		return proxmox.TaskStatus{}, fmt.Errorf("500 no such task %s", upid)
	}
	if t.looks > 0 {
		t.looks--
		return proxmox.TaskStatus{Status: "running"}, nil
	}
	return proxmox.TaskStatus{Status: "stopped", ExitStatus: t.exit}, nil
}
