package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	pveprov "github.com/nstance-dev/nstance/internal/server/provider/proxmox"
	pvefake "github.com/nstance-dev/nstance/internal/server/provider/proxmox/fake"
)

// TestLifecycleProxmox runs the reconciler with the Proxmox VE provider on
// its stateful fake: a group of three is cloned one per node, each VM
// tagged and started with its seed; a VM powered off behind the leader's
// back is replaced (the replacement created first, the stopped one
// destroyed with its seed); a scale-down destroys the surplus; a new
// term finds the fleet through the tags.
func TestLifecycleProxmox(t *testing.T) {
	ctx := context.Background()
	cfg := newShardConfig(t).build(t)
	f := pvefake.New("pve1", "pve2", "pve3")
	f.AddTemplate("pve1", 9000, "ubuntu-24.04", 2048)
	o := pveprov.DefaultOptions()
	o.Endpoint, o.TokenID = "https://pve1.example.com:8006/api2/json", "nstance@pve!server"
	o.Nodes, o.TemplateVMID = []string{"pve1", "pve2", "pve3"}, 9000
	prov := pveprov.New(f, *o, provider.Env{Config: func() *config.Config { return cfg }, Log: logr.Discard()})
	prov.Poll = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1}
	s := newShard(t, cfg, shardOptions{provider: withNonce{prov}})

	vms := func() map[string]pvefake.VMState {
		out := map[string]pvefake.VMState{}
		for _, v := range f.VMs() {
			if !v.Template {
				out[pveprov.ParseOwner(v.Tags).Instance] = v
			}
		}
		return out
	}
	s.upsert(t, "web", 3, 50*time.Millisecond)
	s.advance(t, 100*time.Millisecond)
	ids := s.ids("web")
	require.Len(t, ids, 3)
	require.Len(t, s.running("web"), 3)
	nodes := map[string]bool{}
	for _, id := range ids {
		v, ok := vms()[id]
		require.True(t, ok, "a VM tagged with %s", id)
		require.Equal(t, "running", v.Status)
		require.Equal(t, pveprov.Owner{Cluster: "c1", Shard: "s1", Tenant: "t", Group: "web", Template: "worker", Instance: id}, pveprov.ParseOwner(v.Tags))
		nodes[v.Node] = true
	}
	require.Len(t, nodes, 3, "one member per node")
	list, err := prov.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Len(t, f.Volumes(), 3, "a seed per VM")

	// Powered off behind the leader's back: replaced.
	victim := ids[0]
	f.PowerOff(vms()[victim].VMID)
	s.advance(t, 100*time.Millisecond) // the resync notices; the replacement is created at once
	s.advance(t, 150*time.Millisecond) // it is ready; the stopped member is retired
	s.advance(t, 100*time.Millisecond)
	_, exists := s.insts.Get(victim)
	require.False(t, exists)
	_, exists = vms()[victim]
	require.False(t, exists, "the stopped VM is destroyed")
	require.Len(t, s.running("web"), 3)
	require.Len(t, vms(), 3)
	require.Len(t, f.Volumes(), 3, "the victim's seed went with it")
	require.Equal(t, 4, f.Calls()["Clone"], "one replacement")

	// Scale down: the surplus VMs are destroyed after their drain.
	s.upsert(t, "web", 1, 50*time.Millisecond)
	s.advance(t, 100*time.Millisecond)
	s.advance(t, 100*time.Millisecond)
	left := s.ids("web")
	require.Len(t, left, 1)
	require.Len(t, vms(), 1)
	_, ok := vms()[left[0]]
	require.True(t, ok)
	require.Len(t, f.Volumes(), 1)

	// A new term (another leader) finds the member through its tags and
	// creates nothing.
	clones := f.Calls()["Clone"]
	s.term.End()
	s.startTerm(t)
	s.run(t)
	s.advance(t, 100*time.Millisecond)
	require.Equal(t, left, s.ids("web"))
	require.Equal(t, clones, f.Calls()["Clone"])
}
