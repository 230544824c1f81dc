package proxmox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// platform is what cloudinit.Compose is told: a seed ISO has no user data
// limit worth the name.
var platform = cloudinit.Platform{Name: "Proxmox VE"}

// Provider manages the Proxmox VE VMs of one shard. Safe for concurrent use.
type Provider struct {
	api API
	o   Options
	env provider.Env
	log logr.Logger
	// Poll paces the looks at a task's status (after its steps, at the
	// last delay); Options.TaskTimeout bounds each wait.
	Poll wait.Backoff

	// cloneMu makes NextID and the clone that takes the id one step in
	// this process (Proxmox reserves nothing between them).
	cloneMu sync.Mutex
	mu      sync.Mutex
	// placing counts the creates in flight per group and node, so
	// concurrent creates of a group spread before their VMs show.
	placing map[string]map[string]int
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider calling api. o must have been validated.
func New(api API, o Options, env provider.Env) *Provider {
	return &Provider{api: api, o: o, env: env, log: env.Log,
		Poll:    wait.Backoff{Duration: 250 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 8, Cap: 5 * time.Second},
		placing: map[string]map[string]int{}}
}

func (p *Provider) owner() (cluster, shard string) {
	cfg := p.env.Config()
	return cfg.Cluster.ID, cfg.Shard.ID
}

// marker is the line a clone's description carries from its first moment,
// before its tags are set: it lets a retried create or a delete recognise
// a VM a crash left half-made.
func marker(cluster, shard, id string) string {
	return fmt.Sprintf("nstance: cluster=%s shard=%s instance=%s", cluster, shard, id)
}

// SeedFilename is the name of an instance's seed ISO on the cloud-init
// storage (cluster and shard ids and instance ids are file-name safe).
func SeedFilename(cluster, shard, id string) string {
	return fmt.Sprintf("nstance-%s-%s-%s.iso", cluster, shard, id)
}

// ours is a VM of this shard: tagged with its cluster and shard and an
// instance id.
type ours struct {
	VM
	Owner
}

// shardVMs lists the VMs tagged with this cluster and shard.
func (p *Provider) shardVMs(ctx context.Context) ([]ours, []VM, error) {
	all, err := p.api.Resources(ctx)
	if err != nil {
		return nil, nil, err
	}
	cluster, shard := p.owner()
	var out []ours
	for _, v := range all {
		if v.Template {
			continue
		}
		o := ParseOwner(v.Tags)
		if o.Cluster == cluster && o.Shard == shard && o.Instance != "" {
			out = append(out, ours{VM: v, Owner: o})
		}
	}
	return out, all, nil
}

// find returns the tagged VMs of id, and the untagged ones named id whose
// description carries id's marker (a clone a crash left before its tags).
func (p *Provider) find(ctx context.Context, id string) (tagged []ours, halfMade []VM, all []VM, err error) {
	vms, all, err := p.shardVMs(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, v := range vms {
		if v.Instance == id {
			tagged = append(tagged, v)
		}
	}
	cluster, shard := p.owner()
	for _, v := range all {
		if v.Template || v.Name != id || ParseOwner(v.Tags).Instance != "" {
			continue
		}
		cfg, err := p.api.Config(ctx, v.Node, v.VMID)
		if err != nil {
			return nil, nil, nil, err
		}
		if strings.Contains(cfg.Description, marker(cluster, shard, id)) {
			halfMade = append(halfMade, v)
		}
	}
	return tagged, halfMade, all, nil
}

// Create implements provider.Provider. An instance id that already has a
// tagged VM returns it; a VM a crash left half-made (cloned, not yet
// tagged) is destroyed and the instance made again.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return provider.Instance{}, err
	}
	tagged, halfMade, all, err := p.find(ctx, req.InstanceID)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	if len(tagged) > 0 {
		return p.toInstance(tagged[0]), nil
	}
	for _, v := range halfMade {
		if err := p.destroy(ctx, v, nil); err != nil {
			return provider.Instance{}, fmt.Errorf("instance %s: removing the half-made VM %d: %w", req.InstanceID, v.VMID, err)
		}
	}
	sp, err := p.o.spec(req.Args)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	seed, err := p.seed(req)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	cores, memMiB := p.size(req.InstanceType)
	node, release, err := p.place(ctx, req.GroupID, all, uint64(memMiB)<<20)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	defer release()
	vm, err := p.make(ctx, req, sp, node, seed, cores, memMiB, all)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	p.log.V(1).Info("created", "instance", req.InstanceID, "vmid", vm.VMID, "node", vm.Node)
	return p.toInstance(vm), nil
}

// size is the VM's cores and memory (MiB) from the config's instance
// types; 0: the template's.
func (p *Provider) size(instanceType string) (cores int32, memMiB int64) {
	if instanceType == "" {
		return 0, 0
	}
	t, ok := p.env.Config().InstanceTypes[instanceType]
	if !ok {
		return 0, 0
	}
	return t.VCPUs, t.MemoryMiB
}

// seed renders the instance's seed ISO.
func (p *Provider) seed(req provider.CreateRequest) ([]byte, error) {
	script, err := cloudinit.AgentScript(p.o.Agent, req, p.env.Local.Env)
	if err != nil {
		return nil, err
	}
	ud, err := cloudinit.Compose(script, req, platform)
	if err != nil {
		return nil, err
	}
	return BuildSeedISO(SeedFiles{UserData: ud, MetaData: MetaData(req.InstanceID), NetworkConfig: []byte(p.o.NetworkConfig)})
}

// place picks the node of a new member of group (ChooseNode over the
// configured nodes) and counts it as in flight until release.
func (p *Provider) place(ctx context.Context, group string, all []VM, need uint64) (string, func(), error) {
	nodes, err := p.api.Nodes(ctx)
	if err != nil {
		return "", nil, err
	}
	cluster, shard := p.owner()
	members := map[string]int{}
	for _, v := range all {
		o := ParseOwner(v.Tags)
		if o.Cluster == cluster && o.Shard == shard && o.Group == group && !v.Template {
			members[v.Node]++
		}
	}
	byName := map[string]Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	loads := make([]NodeLoad, 0, len(p.o.Nodes))
	for _, name := range p.o.Nodes {
		n, ok := byName[name]
		free := uint64(0)
		if n.MaxMem > n.Mem {
			free = n.MaxMem - n.Mem
		}
		loads = append(loads, NodeLoad{Name: name, Online: ok && n.Online, FreeMem: free, Members: members[name] + p.placing[group][name]})
	}
	node, err := ChooseNode(loads, need)
	if err != nil {
		return "", nil, err
	}
	if p.placing[group] == nil {
		p.placing[group] = map[string]int{}
	}
	p.placing[group][node]++
	return node, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.placing[group][node]--; p.placing[group][node] <= 0 {
			delete(p.placing[group], node)
		}
		if len(p.placing[group]) == 0 {
			delete(p.placing, group)
		}
	}, nil
}

// make uploads the seed, clones the template to node, tags and configures
// the clone and starts it, waiting for each task. A failed step removes
// what it made; the tags go on in the first step after the clone.
func (p *Provider) make(ctx context.Context, req provider.CreateRequest, sp spec, node string, seed []byte, cores int32, memMiB int64, all []VM) (ours, error) {
	cluster, shard := p.owner()
	tmplID := sp.template(node)
	tmplNode := ""
	for _, v := range all {
		if v.VMID == tmplID {
			tmplNode = v.Node
		}
	}
	if tmplNode == "" {
		return ours{}, fmt.Errorf("template VM %d not found (or not visible to the token)", tmplID)
	}
	file := SeedFilename(cluster, shard, req.InstanceID)
	volume := p.o.CloudInitStorage + ":iso/" + file
	u, err := p.api.Upload(ctx, node, p.o.CloudInitStorage, file, seed)
	if err == nil {
		err = p.wait(ctx, u)
	}
	if err != nil {
		return ours{}, fmt.Errorf("uploading the cloud-init seed: %w", err)
	}
	cleanSeed := func() {
		if u, err := p.api.DeleteVolume(ctx, node, p.o.CloudInitStorage, volume); err == nil {
			_ = p.wait(ctx, u)
		}
	}
	o := CloneOptions{Name: req.InstanceID, Description: marker(cluster, shard, req.InstanceID), Full: p.o.FullClone, Pool: sp.pool}
	if p.o.FullClone {
		o.Storage = sp.storage
	}
	if node != tmplNode {
		o.Target = node
	}
	vmid, err := p.clone(ctx, tmplNode, tmplID, o)
	if err != nil {
		cleanSeed()
		return ours{}, err
	}
	owner := Owner{Cluster: cluster, Shard: shard, Tenant: req.Tenant, Group: req.GroupID, Template: req.Template, Instance: req.InstanceID}
	vm := ours{VM: VM{VMID: vmid, Node: node, Name: req.InstanceID, Status: "stopped"}, Owner: owner}
	opts := []ConfigOption{
		{Name: "tags", Value: strings.Join(OwnerTags(owner, p.o.Tags), ";")},
		{Name: p.o.CloudInitDevice, Value: volume + ",media=cdrom"},
	}
	if cores > 0 {
		opts = append(opts, ConfigOption{Name: "cores", Value: fmt.Sprint(cores)})
	}
	if memMiB > 0 {
		opts = append(opts, ConfigOption{Name: "memory", Value: fmt.Sprint(memMiB)})
	}
	u, err = p.api.SetConfig(ctx, node, vmid, opts...)
	if err == nil {
		err = p.wait(ctx, u)
	}
	if err == nil {
		u, err = p.api.Start(ctx, node, vmid)
		if err == nil {
			err = p.wait(ctx, u)
		}
		if err != nil {
			err = fmt.Errorf("starting VM %d: %w", vmid, err)
		}
	} else {
		err = fmt.Errorf("configuring VM %d: %w", vmid, err)
	}
	if err != nil {
		if derr := p.destroy(ctx, vm.VM, &volume); derr != nil {
			p.log.Error(derr, "removing a VM whose create failed", "instance", req.InstanceID, "vmid", vmid)
		}
		return ours{}, err
	}
	vm.Status = "running"
	return vm, nil
}

// clone takes a free VMID and clones into it, retrying with a new id when
// another client took it between the two calls.
func (p *Provider) clone(ctx context.Context, node string, tmpl int, o CloneOptions) (int, error) {
	var last error
	for range 3 {
		p.cloneMu.Lock()
		id, err := p.api.NextID(ctx)
		if err != nil {
			p.cloneMu.Unlock()
			return 0, err
		}
		o.NewID = id
		u, err := p.api.Clone(ctx, node, tmpl, o)
		p.cloneMu.Unlock()
		if err != nil {
			if strings.Contains(err.Error(), "already exists") {
				last = err
				continue
			}
			return 0, err
		}
		if err := p.wait(ctx, u); err != nil {
			return 0, fmt.Errorf("cloning template %d to VM %d: %w", tmpl, id, err)
		}
		return id, nil
	}
	return 0, fmt.Errorf("cloning template %d: no free VMID after 3 tries: %w", tmpl, last)
}

// wait polls a task until it finishes (Options.TaskTimeout at most) and
// returns its failure.
func (p *Provider) wait(ctx context.Context, upid string) error {
	if upid == "" {
		return nil // a synchronous change: nothing to wait for
	}
	ctx, cancel := context.WithTimeout(ctx, p.o.TaskTimeout.D())
	defer cancel()
	var st TaskStatus
	err := p.Poll.DelayFunc().Until(ctx, true, false, func(ctx context.Context) (bool, error) {
		var err error
		st, err = p.api.TaskStatus(ctx, upid)
		if err != nil {
			return false, err
		}
		return st.Done(), nil
	})
	if err != nil {
		if wait.Interrupted(err) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("task %s not finished after %s (status %q): %w", upid, p.o.TaskTimeout.D(), st.Status, err)
		}
		return fmt.Errorf("task %s: %w", upid, err)
	}
	if !st.OK() {
		return fmt.Errorf("task %s failed: %s", upid, st.ExitStatus)
	}
	return nil
}

// destroy stops v if it runs, destroys it and removes its seed ISO (the
// volume given, else the one its config names).
func (p *Provider) destroy(ctx context.Context, v VM, volume *string) error {
	if volume == nil {
		cfg, err := p.api.Config(ctx, v.Node, v.VMID)
		if err != nil {
			return err
		}
		if s := strings.Split(cfg.Options[p.o.CloudInitDevice], ",")[0]; strings.HasPrefix(s, p.o.CloudInitStorage+":iso/nstance-") {
			volume = &s
		}
	}
	if v.Status != "stopped" {
		u, err := p.api.Stop(ctx, v.Node, v.VMID)
		if err == nil {
			err = p.wait(ctx, u)
		}
		if err != nil {
			return fmt.Errorf("stopping VM %d: %w", v.VMID, err)
		}
	}
	u, err := p.api.Destroy(ctx, v.Node, v.VMID)
	if err == nil {
		err = p.wait(ctx, u)
	}
	if err != nil {
		return fmt.Errorf("destroying VM %d: %w", v.VMID, err)
	}
	if volume != nil {
		u, err := p.api.DeleteVolume(ctx, v.Node, p.o.CloudInitStorage, *volume)
		if err == nil {
			err = p.wait(ctx, u)
		}
		if err != nil {
			return fmt.Errorf("deleting the seed %s of VM %d: %w", *volume, v.VMID, err)
		}
	}
	return nil
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	vms, _, err := p.shardVMs(ctx)
	if err != nil {
		return provider.Instance{}, err
	}
	for _, v := range vms {
		if v.Instance == id {
			return p.toInstance(v), nil
		}
	}
	return provider.Instance{}, fmt.Errorf("%w: %s", provider.ErrNotFound, id)
}

// List implements provider.Provider: every VM tagged with this cluster and
// shard, sorted by instance id.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	vms, _, err := p.shardVMs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]provider.Instance, 0, len(vms))
	for _, v := range vms {
		out = append(out, p.toInstance(v))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].InstanceID < out[b].InstanceID })
	return out, nil
}

// Delete implements provider.Provider: stops and destroys every VM of the
// id (a half-made one too) and its seed ISO; none is not an error.
func (p *Provider) Delete(ctx context.Context, id string) error {
	tagged, halfMade, _, err := p.find(ctx, id)
	if err != nil {
		return fmt.Errorf("deleting instance %s: %w", id, err)
	}
	vms := halfMade
	for _, v := range tagged {
		vms = append(vms, v.VM)
	}
	for _, v := range vms {
		if err := p.destroy(ctx, v, nil); err != nil {
			return fmt.Errorf("deleting instance %s: %w", id, err)
		}
	}
	return nil
}

// toInstance maps a VM to the provider's view: running → running,
// stopped → stopped, anything else (paused, suspended) pending.
func (p *Provider) toInstance(v ours) provider.Instance {
	out := provider.Instance{InstanceID: v.Instance, ProviderID: provider.ID(v.Cluster, v.Shard, v.Instance), State: provider.StatePending,
		Message: fmt.Sprintf("pve vm %d on %s %s", v.VMID, v.Node, v.Status)}
	switch v.Status {
	case "running":
		out.State = provider.StateRunning
	case "stopped":
		out.State = provider.StateStopped
	}
	return out
}
