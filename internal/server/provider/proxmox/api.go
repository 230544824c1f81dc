package proxmox

import (
	"context"
	"sort"
	"strings"
)

// VM is one row of GET /cluster/resources?type=vm: a virtual machine (or
// template) anywhere in the Proxmox VE cluster.
type VM struct {
	VMID     int
	Node     string
	Name     string
	Status   string // running, stopped, ...
	Tags     []string
	Template bool
	MaxMem   uint64
}

// Node is one row of GET /nodes.
type Node struct {
	Name   string
	Online bool
	// MaxMem and Mem are the node's memory and its use, in bytes.
	MaxMem, Mem uint64
}

// VMConfig is what the provider reads of GET /nodes/{node}/qemu/{vmid}/config.
type VMConfig struct {
	Name        string
	Description string
	Tags        []string
	// Options are the other keys as Proxmox renders them (ide3, cores, ...).
	Options map[string]string
}

// CloneOptions are the parameters of POST /nodes/{node}/qemu/{vmid}/clone.
type CloneOptions struct {
	NewID       int
	Name        string
	Description string
	// Target is the node the clone goes to ("" : the template's).
	Target string
	// Full makes a full copy of the template's disks (a linked clone
	// otherwise); Storage is where a full clone's disks go ("": the
	// template's).
	Full    bool
	Storage string
	Pool    string
}

// ConfigOption is one key of POST /nodes/{node}/qemu/{vmid}/config.
type ConfigOption struct {
	Name, Value string
}

// TaskStatus is GET /nodes/{node}/tasks/{upid}/status: a task is done when
// Status is "stopped"; ExitStatus "OK" (or "WARNINGS: n") is success.
type TaskStatus struct {
	Status     string
	ExitStatus string
}

// Done reports whether the task has finished.
func (s TaskStatus) Done() bool { return s.Status == "stopped" }

// OK reports whether a finished task succeeded.
func (s TaskStatus) OK() bool {
	return s.ExitStatus == "OK" || strings.HasPrefix(s.ExitStatus, "WARNINGS")
}

// API is every Proxmox VE call this package makes; Client implements it on
// github.com/luthermonson/go-proxmox, the fake sub-package in memory. Each
// method is one API path, listed with the privileges it needs in Calls.
type API interface {
	// Resources lists every VM of the cluster (GET /cluster/resources?type=vm).
	Resources(ctx context.Context) ([]VM, error)
	// Nodes lists the cluster's nodes with their memory (GET /nodes).
	Nodes(ctx context.Context) ([]Node, error)
	// NextID returns a free VMID (GET /cluster/nextid).
	NextID(ctx context.Context) (int, error)
	// Config reads a VM's configuration.
	Config(ctx context.Context, node string, vmid int) (VMConfig, error)
	// Clone copies the template vmid on node; the answer is the task's UPID.
	Clone(ctx context.Context, node string, vmid int, o CloneOptions) (string, error)
	// SetConfig changes a VM's configuration (asynchronously: a UPID).
	SetConfig(ctx context.Context, node string, vmid int, opts ...ConfigOption) (string, error)
	// Start and Stop power a VM on and off (hard stop).
	Start(ctx context.Context, node string, vmid int) (string, error)
	Stop(ctx context.Context, node string, vmid int) (string, error)
	// Destroy deletes a stopped VM and its disks.
	Destroy(ctx context.Context, node string, vmid int) (string, error)
	// Upload stores an ISO image named filename on a storage of node.
	Upload(ctx context.Context, node, storage, filename string, body []byte) (string, error)
	// DeleteVolume removes a volume (storage:iso/name.iso) from a storage.
	DeleteVolume(ctx context.Context, node, storage, volume string) (string, error)
	// TaskStatus reads the status of a task (its node is in its UPID).
	TaskStatus(ctx context.Context, upid string) (TaskStatus, error)
}

// Call is one API path the provider calls, with the privileges Proxmox VE
// checks for it and on which ACL path (the role in deploy/proxmox grants
// their union).
type Call struct {
	Method, Path string
	// Privileges are checked on ACL; none: any authenticated user (results
	// filtered by what the token may see, or its own tasks).
	Privileges []string
	ACL        string
}

// Calls are the API paths of every API method, in the order of API.
var Calls = []Call{
	{"GET", "/cluster/resources", []string{"VM.Audit"}, "/vms (or the pool): a VM the token cannot audit is invisible"},
	{"GET", "/nodes", []string{"Sys.Audit"}, "/nodes: without it the list has no memory figures"},
	{"GET", "/cluster/nextid", nil, ""},
	{"GET", "/nodes/{node}/qemu/{vmid}/config", []string{"VM.Audit"}, "/vms/{vmid}"},
	{"POST", "/nodes/{node}/qemu/{vmid}/clone", []string{"VM.Clone", "VM.Allocate", "Datastore.AllocateSpace", "SDN.Use"},
		"VM.Clone on the template, VM.Allocate on /vms/{newid} or the pool, Datastore.AllocateSpace on the disks' storage, SDN.Use on the bridge"},
	{"POST", "/nodes/{node}/qemu/{vmid}/config", []string{"VM.Config.Options", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Memory", "Datastore.Audit"},
		"/vms/{vmid} (tags: Options; the cloud-init ISO: CDROM, and Datastore.Audit on its storage; cores/memory from the instance type)"},
	{"POST", "/nodes/{node}/qemu/{vmid}/status/start", []string{"VM.PowerMgmt"}, "/vms/{vmid}"},
	{"POST", "/nodes/{node}/qemu/{vmid}/status/stop", []string{"VM.PowerMgmt"}, "/vms/{vmid}"},
	{"DELETE", "/nodes/{node}/qemu/{vmid}", []string{"VM.Allocate"}, "/vms/{vmid}"},
	{"POST", "/nodes/{node}/storage/{storage}/upload", []string{"Datastore.AllocateTemplate"}, "/storage/{cloudinit_storage}"},
	{"DELETE", "/nodes/{node}/storage/{storage}/content/{volume}", []string{"Datastore.Allocate"}, "/storage/{cloudinit_storage}"},
	{"GET", "/nodes/{node}/tasks/{upid}/status", nil, "(the token's own tasks)"},
}

// Privileges returns the union of the privileges of Calls, sorted: what
// the role of the server's API token must grant.
func Privileges() []string {
	set := map[string]bool{}
	for _, c := range Calls {
		for _, p := range c.Privileges {
			set[p] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
