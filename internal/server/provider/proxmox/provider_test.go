package proxmox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox/fake"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
)

const templateVMID = 9000

func testConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(shardtest.Config("c1", "s1", "mock")))
	require.NoError(t, err)
	return cfg
}

func testOptions() proxmox.Options {
	o := proxmox.DefaultOptions()
	o.Endpoint = "https://pve1.example.com:8006/api2/json"
	o.TokenID = "nstance@pve!server"
	o.Nodes = []string{"pve1", "pve2", "pve3"}
	o.TemplateVMID = templateVMID
	o.Tags = []string{"k8s"}
	return *o
}

// fastPoll looks at tasks without real waits (the fake's tasks finish
// after TaskLooks looks).
var fastPoll = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1}

func newProvider(t testing.TB, f *fake.Fake, o proxmox.Options) *proxmox.Provider {
	t.Helper()
	cfg := testConfig(t)
	p := proxmox.New(f, o, provider.Env{Config: func() *config.Config { return cfg }, Log: logr.Discard()})
	p.Poll = fastPoll
	return p
}

func request(id, group string) provider.CreateRequest {
	return provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "s1", id), Cluster: "c1", Shard: "s1", Tenant: "acme",
		GroupID: group, Template: "worker", InstanceType: "test.small", AgentNonce: "nonce-" + id, CACertPEM: []byte("CA PEM"),
		RegistrationAddr: "10.0.0.10:8990", AgentAddr: "10.0.0.10:8991"}
}

func vmOf(t *testing.T, f *fake.Fake, id string) fake.VMState {
	t.Helper()
	for _, v := range f.VMs() {
		if v.Name == id && !v.Template {
			return v
		}
	}
	t.Fatalf("no VM named %s", id)
	return fake.VMState{}
}

func TestCreateStatusListDelete(t *testing.T) {
	ctx := context.Background()
	f := fake.New("pve1", "pve2", "pve3")
	f.AddTemplate("pve1", templateVMID, "ubuntu-24.04", 2048)
	f.TaskLooks = 2
	p := newProvider(t, f, testOptions())

	req := request("web-0a1b2c3d", "web")
	req.UserData = []byte("#cloud-config\npackages: [htop]\n")
	req.UserDataFormat = "cloud-config"
	inst, err := p.Create(ctx, req)
	require.NoError(t, err)
	require.Equal(t, provider.Instance{InstanceID: req.InstanceID, ProviderID: req.ProviderID, State: provider.StateRunning,
		Message: "pve vm 100 on pve1 running"}, inst)

	vm := vmOf(t, f, req.InstanceID)
	require.Equal(t, templateVMID, vm.ClonedFrom)
	require.Equal(t, "running", vm.Status)
	require.Equal(t, []string{"k8s", "nstance-cluster.c1", "nstance-group.web", "nstance-instance.web-0a1b2c3d", "nstance-shard.s1",
		"nstance-template.worker", "nstance-tenant.acme"}, vm.Tags)
	require.Equal(t, "2", vm.Options["cores"], "from the instance type test.small")
	require.Equal(t, "4096", vm.Options["memory"])
	const volume = "local:iso/nstance-c1-s1-web-0a1b2c3d.iso"
	require.Equal(t, volume+",media=cdrom", vm.Options["ide3"])
	img, ok := f.Volume("pve1", volume)
	require.True(t, ok)
	label, files, err := proxmox.ReadSeedISO(img)
	require.NoError(t, err)
	require.Equal(t, "cidata", label)
	require.Equal(t, "instance-id: web-0a1b2c3d\nlocal-hostname: web-0a1b2c3d\n", string(files["meta-data"]))
	ud := string(files["user-data"])
	require.True(t, strings.HasPrefix(ud, "Content-Type: multipart/mixed"), "the agent's part and the user's: %s", ud)
	require.Contains(t, ud, "packages: [htop]")
	require.Contains(t, ud, "nstance agent bootstrap, written by nstance-server for instance web-0a1b2c3d")

	// Idempotent: the same id returns the VM, nothing is cloned again.
	clones := f.Calls()["Clone"]
	again, err := p.Create(ctx, req)
	require.NoError(t, err)
	require.Equal(t, inst, again)
	require.Equal(t, clones, f.Calls()["Clone"])

	got, err := p.Status(ctx, req.InstanceID)
	require.NoError(t, err)
	require.Equal(t, inst, got)
	_, err = p.Status(ctx, "web-ffffffff")
	require.ErrorIs(t, err, provider.ErrNotFound)

	// A stranger (no tags) and another shard's VM are not listed.
	f.AddVM(fake.VMState{VMID: 500, Node: "pve2", Name: "db-1", Status: "running"})
	f.AddVM(fake.VMState{VMID: 501, Node: "pve2", Name: "web-1", Status: "running",
		Tags: proxmox.OwnerTags(proxmox.Owner{Cluster: "c1", Shard: "s2", Instance: "web-1"}, nil)})
	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []provider.Instance{inst}, list)

	f.PowerOff(vm.VMID)
	got, err = p.Status(ctx, req.InstanceID)
	require.NoError(t, err)
	require.Equal(t, provider.StateStopped, got.State)

	require.NoError(t, p.Delete(ctx, req.InstanceID))
	_, err = p.Status(ctx, req.InstanceID)
	require.ErrorIs(t, err, provider.ErrNotFound)
	require.Empty(t, f.Volumes(), "the seed ISO (it holds the nonce) goes with the VM")
	require.NoError(t, p.Delete(ctx, req.InstanceID), "deleting what is gone is not an error")
	require.Len(t, f.VMs(), 3, "the template and the two strangers stay")
}

func TestSpreadAcrossNodes(t *testing.T) {
	ctx := context.Background()
	f := fake.New("pve1", "pve2", "pve3", "pve4")
	f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
	f.SetNodeMemory("pve3", 40<<30)
	o := testOptions() // pve4 is not one of the nodes
	p := newProvider(t, f, o)
	for i := range 6 {
		_, err := p.Create(ctx, request(fmt.Sprintf("web-%08d", i), "web"))
		require.NoError(t, err)
	}
	_, err := p.Create(ctx, request("db-00000000", "db"))
	require.NoError(t, err)
	per := map[string]map[string]int{}
	for _, v := range f.VMs() {
		if v.Template {
			continue
		}
		g := proxmox.ParseOwner(v.Tags).Group
		if per[g] == nil {
			per[g] = map[string]int{}
		}
		per[g][v.Node]++
	}
	require.Equal(t, map[string]int{"pve1": 2, "pve2": 2, "pve3": 2}, per["web"])
	// db's first member goes where most memory is free: pve1 and pve2
	// have 64 GiB, pve3 40.
	require.Equal(t, map[string]int{"pve1": 1}, per["db"])
	for _, v := range f.VMs() {
		if !v.Template && v.Node != "pve1" {
			require.Equal(t, templateVMID, v.ClonedFrom, "cloned across nodes from the one template")
		}
	}

	// A node going down takes no new VM; one with too little memory either.
	f.SetOnline("pve2", false)
	f.SetNodeMemory("pve1", 10<<30) // 3 running VMs use 12 GiB
	_, err = p.Create(ctx, request("web-00000006", "web"))
	require.NoError(t, err)
	require.Equal(t, "pve3", vmOf(t, f, "web-00000006").Node)
}

func TestNodeTemplatesCloneLocally(t *testing.T) {
	ctx := context.Background()
	f := fake.New("pve1", "pve2")
	f.AddTemplate("pve1", 9001, "ubuntu-a", 2048)
	f.AddTemplate("pve2", 9002, "ubuntu-b", 2048)
	o := testOptions()
	o.Nodes = []string{"pve1", "pve2"}
	o.TemplateVMID = 0
	o.NodeTemplates = map[string]int{"pve1": 9001, "pve2": 9002}
	p := newProvider(t, f, o)
	for _, id := range []string{"web-00000001", "web-00000002"} {
		_, err := p.Create(ctx, request(id, "web"))
		require.NoError(t, err)
	}
	a, b := vmOf(t, f, "web-00000001"), vmOf(t, f, "web-00000002")
	require.Equal(t, map[string]int{a.Node: a.ClonedFrom, b.Node: b.ClonedFrom}, map[string]int{"pve1": 9001, "pve2": 9002})

	// A template named by the instance's args wins on every node.
	f.AddTemplate("pve2", 9100, "ubuntu-c", 2048)
	req := request("web-00000003", "web")
	req.Args = map[string]string{provider.ArgImage: "9100"}
	_, err := p.Create(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 9100, vmOf(t, f, "web-00000003").ClonedFrom)
}

func TestFailedStepsCleanUp(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []string{"qmconfig", "qmstart"} {
		t.Run(kind, func(t *testing.T) {
			f := fake.New("pve1")
			f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
			f.FailTask = func(k string, _ int) string {
				if k == kind {
					return "command failed: exit code 1"
				}
				return ""
			}
			o := testOptions()
			o.Nodes = []string{"pve1"}
			p := newProvider(t, f, o)
			_, err := p.Create(ctx, request("web-0a1b2c3d", "web"))
			require.ErrorContains(t, err, "failed: command failed: exit code 1")
			require.Len(t, f.VMs(), 1, "the clone is destroyed")
			require.Empty(t, f.Volumes(), "the seed is deleted")
		})
	}
	t.Run("clone", func(t *testing.T) {
		f := fake.New("pve1")
		f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
		f.Fail = func(m, _ string) error {
			if m == "Clone" {
				return errors.New("500 storage 'local-lvm' is full")
			}
			return nil
		}
		o := testOptions()
		o.Nodes = []string{"pve1"}
		p := newProvider(t, f, o)
		_, err := p.Create(ctx, request("web-0a1b2c3d", "web"))
		require.ErrorContains(t, err, "storage 'local-lvm' is full")
		require.Empty(t, f.Volumes(), "the seed is deleted")
	})
}

func TestVMIDTakenBetweenNextIDAndClone(t *testing.T) {
	ctx := context.Background()
	f := fake.New("pve1")
	f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
	o := testOptions()
	o.Nodes = []string{"pve1"}
	p := newProvider(t, f, o)
	taken := false
	f.Fail = func(m, _ string) error {
		if m == "Clone" && !taken {
			taken = true
			// Someone else's clone took the id NextID answered.
			f.AddVM(fake.VMState{VMID: 100, Node: "pve1", Name: "other"})
			return errors.New("500 unable to create VM 100: config file already exists")
		}
		return nil
	}
	_, err := p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	require.Equal(t, 2, f.Calls()["NextID"], "a fresh id after the first was taken")
}

func TestHalfMadeCloneIsRemoved(t *testing.T) {
	ctx := context.Background()
	f := fake.New("pve1")
	f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
	o := testOptions()
	o.Nodes = []string{"pve1"}
	p := newProvider(t, f, o)
	// A crash after the clone, before its tags: named after the instance,
	// marked in its description, tagged as the template was.
	f.AddVM(fake.VMState{VMID: 120, Node: "pve1", Name: "web-0a1b2c3d", Status: "stopped", ClonedFrom: templateVMID,
		Description: "nstance: cluster=c1 shard=s1 instance=web-0a1b2c3d"})
	// The same name in another shard is not ours.
	f.AddVM(fake.VMState{VMID: 121, Node: "pve1", Name: "web-0a1b2c3d", Status: "running",
		Description: "nstance: cluster=c1 shard=s2 instance=web-0a1b2c3d"})

	_, err := p.Status(ctx, "web-0a1b2c3d")
	require.ErrorIs(t, err, provider.ErrNotFound, "not listed: it was never finished")
	_, err = p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	var ids []int
	for _, v := range f.VMs() {
		ids = append(ids, v.VMID)
	}
	require.Equal(t, []int{100, 121, templateVMID}, ids, "120 destroyed, 121 left alone")

	f.AddVM(fake.VMState{VMID: 130, Node: "pve1", Name: "web-11111111", Status: "stopped",
		Description: "nstance: cluster=c1 shard=s1 instance=web-11111111"})
	require.NoError(t, p.Delete(ctx, "web-11111111"))
	for _, v := range f.VMs() {
		require.NotEqual(t, 130, v.VMID, "a delete removes a half-made VM too")
	}
}

func TestTaskTimeout(t *testing.T) {
	f := fake.New("pve1")
	f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
	f.TaskLooks = 1 << 30
	o := testOptions()
	o.Nodes = []string{"pve1"}
	o.TaskTimeout = config.Duration(50 * time.Millisecond)
	p := newProvider(t, f, o)
	p.Poll = wait.Backoff{Duration: 5 * time.Millisecond, Factor: 1, Steps: 1}
	_, err := p.Create(context.Background(), request("web-0a1b2c3d", "web"))
	require.ErrorContains(t, err, "not finished after 50ms")
}

func TestIgnitionIsRefused(t *testing.T) {
	f := fake.New("pve1")
	f.AddTemplate("pve1", templateVMID, "ubuntu", 2048)
	p := newProvider(t, f, testOptions())
	req := request("web-0a1b2c3d", "web")
	req.UserData, req.UserDataFormat = []byte(`{"ignition":{}}`), "ignition"
	_, err := p.Create(context.Background(), req)
	require.ErrorContains(t, err, "cannot travel beside the agent's cloud-init bootstrap on Proxmox VE")
	require.Zero(t, f.Calls()["Clone"])
}
