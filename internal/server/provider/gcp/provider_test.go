package gcp_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
	"github.com/nstance-dev/nstance/internal/server/provider/gcp/fake"
)

const (
	caPEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
	zone  = "europe-west4-a"
)

func testConfig() *config.Config {
	cfg := &config.Config{}
	cfg.Cluster.ID, cfg.Shard.ID = "c1", "s1"
	cfg.Shard.Infra = config.Infra{Provider: "gcp", Region: "europe-west4", Zone: zone}
	cfg.Shard.SubnetPools = map[string]config.SubnetPool{
		"default": {Subnets: []string{"regions/europe-west4/subnetworks/a", "regions/europe-west4/subnetworks/b"}},
	}
	cfg.Templates = map[string]config.Template{"worker": {InstanceType: "e2-standard-2"}}
	return cfg
}

type harness struct {
	gce *fake.Compute
	p   *gcp.Provider
	cfg *config.Config
}

func testOptions() *gcp.Options {
	o := gcp.DefaultOptions()
	o.Project = fake.Project
	o.Image = "projects/debian-cloud/global/images/family/debian-12"
	o.Labels = map[string]string{"team": "infra"}
	o.ServiceAccount = "nodes@fake-project.iam.gserviceaccount.com"
	o.NetworkTags = []string{"nstance-node"}
	return o
}

func newHarness(t *testing.T, mutate func(*gcp.Options)) *harness {
	t.Helper()
	h := &harness{gce: fake.New(), cfg: testConfig()}
	o := testOptions()
	if mutate != nil {
		mutate(o)
	}
	require.Empty(t, o.Validate(h.cfg))
	h.p = gcp.New(h.gce, *o, provider.Env{Config: func() *config.Config { return h.cfg },
		Local: provider.Local{Env: []string{"NSTANCE_METRICS_INTERVAL=5s"}}})
	return h
}

func request(id, group string) provider.CreateRequest {
	return provider.CreateRequest{
		InstanceID: id, ProviderID: provider.ID("c1", "s1", id), Cluster: "c1", Shard: "s1", Tenant: "acme",
		GroupID: group, Template: "worker", InstanceType: "e2-standard-2", SubnetPool: "default",
		AgentNonce: "nonce-" + id, CACertPEM: []byte(caPEM),
		RegistrationAddr: "10.0.0.5:8992", AgentAddr: "10.0.0.5:8994",
	}
}

func TestCreateListStatusDelete(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	inst, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	require.Equal(t, "web-0a1b2c3d", inst.InstanceID)
	require.Equal(t, provider.ID("c1", "s1", "web-0a1b2c3d"), inst.ProviderID)
	require.Equal(t, provider.StateRunning, inst.State)
	require.NotEmpty(t, inst.Addresses)

	ins := h.gce.Inserts()
	require.Len(t, ins, 1)
	in := ins[0].GetInstanceResource()
	require.Equal(t, "web-0a1b2c3d", in.GetName())
	require.Equal(t, zone, ins[0].GetZone())
	require.Equal(t, fake.Project, ins[0].GetProject())
	require.Equal(t, map[string]string{"team": "infra", gcp.LabelCluster: "c1", gcp.LabelShard: "s1", gcp.LabelInstanceID: "web-0a1b2c3d",
		gcp.LabelTenant: "acme", gcp.LabelGroup: "web", gcp.LabelTemplate: "worker"}, in.GetLabels())
	require.Equal(t, "zones/"+zone+"/machineTypes/e2-standard-2", in.GetMachineType())
	require.Equal(t, "projects/debian-cloud/global/images/family/debian-12", in.GetDisks()[0].GetInitializeParams().GetSourceImage())
	require.True(t, in.GetDisks()[0].GetBoot())
	require.True(t, in.GetDisks()[0].GetAutoDelete())
	require.Contains(t, []string{"regions/europe-west4/subnetworks/a", "regions/europe-west4/subnetworks/b"}, in.GetNetworkInterfaces()[0].GetSubnetwork())
	require.Equal(t, "nodes@fake-project.iam.gserviceaccount.com", in.GetServiceAccounts()[0].GetEmail())
	require.Equal(t, []string{"nstance-node"}, in.GetTags().GetItems())
	require.Nil(t, in.GetScheduling(), "standard provisioning by default")
	ud := gcp.Meta(in, gcp.MetaUserData)
	require.True(t, strings.HasPrefix(ud, "#!/bin/sh\n"), ud)
	require.Contains(t, ud, "systemctl enable --now nstance-agent.service")
	require.Equal(t, "web-0a1b2c3d", gcp.Meta(in, gcp.MetaInstanceID))

	_, err = h.p.Create(ctx, request("web-11111111", "web"))
	require.NoError(t, err)
	list, err := h.p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "web-0a1b2c3d", list[0].InstanceID)
	require.Equal(t, "web-11111111", list[1].InstanceID)

	st, err := h.p.Status(ctx, "web-11111111")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State)
	h.gce.SetStatus(zone, "web-11111111", "TERMINATED")
	st, err = h.p.Status(ctx, "web-11111111")
	require.NoError(t, err)
	require.Equal(t, provider.StateStopped, st.State)

	require.NoError(t, h.p.Delete(ctx, "web-11111111"))
	require.NoError(t, h.p.Delete(ctx, "web-11111111"), "deleting a missing instance is no error")
	_, err = h.p.Status(ctx, "web-11111111")
	require.ErrorIs(t, err, provider.ErrNotFound)
	list, err = h.p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

// The user's bootstrap data travels beside the agent's in the user-data
// metadata value, a string of up to 256 KiB: a document above EC2's 16 KiB
// is sent as it is (never gzip, which a string value cannot carry), and one
// above the metadata limit is refused before any API call.
func TestUserDataFitsTheMetadataLimit(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	req := request("web-0a1b2c3d", "web")
	req.UserData = []byte("#cloud-config\nwrite_files:\n" + strings.Repeat("- path: /etc/motd\n  content: hello\n", 1200))
	require.Greater(t, len(req.UserData), 32<<10)
	_, err := h.p.Create(ctx, req)
	require.NoError(t, err)
	ud := gcp.Meta(h.gce.Inserts()[0].GetInstanceResource(), gcp.MetaUserData)
	require.True(t, utf8.ValidString(ud), "a metadata value is a string")
	require.True(t, strings.HasPrefix(ud, "Content-Type: multipart/mixed"), ud[:min(len(ud), 80)])
	require.Contains(t, ud, string(req.UserData), "the user's part as it was given")

	big := request("web-11111111", "web")
	big.UserData = []byte("#!/bin/sh\n" + strings.Repeat("echo 0123456789abcdef\n", gcp.MaxUserData/20))
	_, err = h.p.Create(ctx, big)
	require.ErrorContains(t, err, "a Compute Engine metadata value allows")
	require.Len(t, h.gce.Inserts(), 1, "nothing was sent for the refused one")
}

func TestCreateIsIdempotent(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	first, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	again, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err, "a repeated create returns the first one's instance")
	require.Equal(t, first, again)
	require.Len(t, h.gce.Instances(), 1)

	// A foreign instance holding the name is not ours to return.
	h.gce.PutInstance(zone, &computepb.Instance{Name: proto.String("web-22222222")})
	_, err = h.p.Create(ctx, request("web-22222222", "web"))
	require.ErrorContains(t, err, "not this shard's instance")
}

func TestForeignAndOtherShardsAreLeftOut(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	_, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	// Same labels (folded), other exact cluster id in the metadata.
	h.gce.PutInstance(zone, &computepb.Instance{Name: proto.String("web-33333333"),
		Labels: map[string]string{gcp.LabelCluster: "c1", gcp.LabelShard: "s1", gcp.LabelInstanceID: "web-33333333"},
		Metadata: &computepb.Metadata{Items: []*computepb.Items{{Key: proto.String(gcp.MetaCluster), Value: proto.String("C1")},
			{Key: proto.String(gcp.MetaShard), Value: proto.String("s1")}, {Key: proto.String(gcp.MetaInstanceID), Value: proto.String("web-33333333")}}}})
	h.gce.PutInstance(zone, &computepb.Instance{Name: proto.String("hand-made")})
	list, err := h.p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	_, err = h.p.Status(ctx, "web-33333333")
	require.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, h.p.Delete(ctx, "web-33333333"))
	require.Len(t, h.gce.Instances(), 3, "the foreign instance is not deleted")
}

func TestSpotAndTemplateArgs(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, func(o *gcp.Options) { o.Image, o.InstanceTemplate = "", "global/instanceTemplates/default" })
	h.gce.AddTemplate("workers", &computepb.InstanceProperties{MachineType: proto.String("n2-standard-4"),
		Disks: []*computepb.AttachedDisk{{Boot: proto.Bool(true), InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: proto.String("img")}}}})
	req := request("web-0a1b2c3d", "web")
	req.InstanceType = ""
	req.SubnetPool = ""
	req.Args = map[string]string{gcp.ArgInstanceTemplate: "global/instanceTemplates/workers", gcp.ArgProvisioningModel: gcp.ProvisioningSpot}
	inst, err := h.p.Create(ctx, req)
	require.NoError(t, err)
	require.Contains(t, inst.Message, "spot")
	in := h.gce.Inserts()[0]
	require.Equal(t, "global/instanceTemplates/workers", in.GetSourceInstanceTemplate())
	require.Empty(t, in.GetInstanceResource().GetDisks(), "the template's disks")
	require.Empty(t, in.GetInstanceResource().GetMachineType(), "the template's machine type")
	sch := in.GetInstanceResource().GetScheduling()
	require.Equal(t, gcp.ProvisioningSpot, sch.GetProvisioningModel())
	require.Equal(t, "DELETE", sch.GetInstanceTerminationAction())

	got := h.gce.Instances()[0]
	require.Equal(t, "zones/"+zone+"/machineTypes/n2-standard-4", got.GetMachineType())

	// The agent learns to watch the metadata server's preemption flag.
	require.Contains(t, decodedEnv(t, gcp.Meta(in.GetInstanceResource(), gcp.MetaUserData)), gcp.SpotNoticeEnv)

	// Preempted and reclaimed: gone from the listing.
	require.NoError(t, h.gce.Preempt(zone, "web-0a1b2c3d"))
	st, err := h.p.Status(ctx, "web-0a1b2c3d")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State, "running through its grace")
	h.gce.Reclaim(zone, "web-0a1b2c3d")
	_, err = h.p.Status(ctx, "web-0a1b2c3d")
	require.ErrorIs(t, err, provider.ErrNotFound)
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.gce.Fail("InsertInstance", http.StatusForbidden)
	_, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.ErrorContains(t, err, "instances.insert web-0a1b2c3d")
	require.Equal(t, http.StatusForbidden, gcp.HTTPCode(err))
	h.gce.Fail("ListInstances", http.StatusServiceUnavailable)
	_, err = h.p.List(ctx)
	require.Error(t, err)
	require.False(t, errors.Is(err, provider.ErrNotFound))
	_, err = h.p.Create(ctx, provider.CreateRequest{InstanceID: "Bad_ID"})
	require.Error(t, err)
	req := request("web-0a1b2c3d", "web")
	req.SubnetPool = "nope"
	_, err = h.p.Create(ctx, req)
	require.ErrorContains(t, err, `subnet pool "nope"`)
}

func TestNamesAndLabels(t *testing.T) {
	for _, tc := range []struct{ id, name string }{
		{"web-0a1b2c3d", "web-0a1b2c3d"},
		{"0web", "n0web"},
		{"1" + strings.Repeat("a", 61) + "-b", "n1" + strings.Repeat("a", 61)},
	} {
		require.Equal(t, tc.name, gcp.InstanceName(tc.id), tc.id)
		require.LessOrEqual(t, len(gcp.InstanceName(tc.id)), 63)
	}
	for _, tc := range []struct{ in, out string }{
		{"prod", "prod"}, {"Prod.EU", "prod_eu"}, {strings.Repeat("x", 70), strings.Repeat("x", 63)}, {"a/b:c", "a_b_c"},
	} {
		require.Equal(t, tc.out, gcp.LabelValue(tc.in), tc.in)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*gcp.Options, *config.Config)
		keys   []string
	}{
		{"ok", func(*gcp.Options, *config.Config) {}, nil},
		{"no zone", func(_ *gcp.Options, c *config.Config) { c.Shard.Infra.Zone = "" }, []string{"shard.infra.zone"}},
		{"bad project", func(o *gcp.Options, _ *config.Config) { o.Project = "X" }, []string{"shard.infra.options.project"}},
		{"bad model", func(o *gcp.Options, _ *config.Config) { o.ProvisioningModel = "spot" }, []string{"shard.infra.options.provisioning_model"}},
		{"reserved label", func(o *gcp.Options, _ *config.Config) { o.Labels = map[string]string{"nstance-x": "y"} }, []string{"shard.infra.options.labels.nstance-x"}},
		{"bad label", func(o *gcp.Options, _ *config.Config) { o.Labels = map[string]string{"Team": "y"} }, []string{"shard.infra.options.labels.Team"}},
		{"bad tag", func(o *gcp.Options, _ *config.Config) { o.NetworkTags = []string{"A"} }, []string{"shard.infra.options.network_tags[0]"}},
		{"no image", func(o *gcp.Options, _ *config.Config) { o.Image = "" }, []string{"templates.worker.args"}},
		{"no machine type", func(_ *gcp.Options, c *config.Config) { c.Templates["worker"] = config.Template{} }, []string{"templates.worker.instance_type"}},
		{"template without type", func(o *gcp.Options, c *config.Config) {
			o.InstanceTemplate = "global/instanceTemplates/x"
			c.Templates["worker"] = config.Template{}
		}, nil},
		{"dynamic pools", func(_ *gcp.Options, c *config.Config) {
			c.Shard.DynamicSubnetPools = map[string]config.DynamicSubnetPool{"d": {Tags: map[string]string{"a": "b"}}}
		}, []string{"shard.dynamic_subnet_pools"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, cfg := testOptions(), testConfig()
			tc.mutate(o, cfg)
			var keys []string
			for _, e := range o.Validate(cfg) {
				keys = append(keys, e.Key)
			}
			require.Equal(t, tc.keys, keys)
		})
	}
}

func TestRegistryDecodesTheKind(t *testing.T) {
	reg := provider.NewRegistry(gcp.Kind())
	cfg := testConfig()
	cfg.Shard.Infra.Options = map[string]any{"project": "fake-project", "image": "img", "provisioning_model": "SPOT"}
	kc, err := reg.Decode(cfg)
	require.NoError(t, err)
	o := kc.(*gcp.Options)
	require.Equal(t, gcp.ProvisioningSpot, o.ProvisioningModel)
	require.Equal(t, gcp.DefaultDiskType, o.DiskType, "defaults kept")
	cfg.Shard.Infra.Options = map[string]any{"project": "fake-project", "image": "img", "nope": 1}
	_, err = reg.Decode(cfg)
	require.Error(t, err)
}

func TestIAMPermissions(t *testing.T) {
	perms := gcp.IAMPermissions()
	require.Contains(t, perms, "compute.instances.create")
	require.Contains(t, perms, "compute.instances.updateNetworkInterface")
	require.Contains(t, perms, "compute.instanceGroups.update")
	methods := gcp.APIMethods()
	require.Len(t, gcp.RESTMethods, len(methods), "every API method has its REST method")
	for _, m := range methods {
		rest, ok := gcp.RESTMethods[m]
		require.True(t, ok, m)
		require.NotEmpty(t, gcp.Permissions[rest], rest)
	}
}

var fileRE = regexp.MustCompile(`printf '%s' '([A-Za-z0-9+/=]*)' \| base64 -d`)

// decodedEnv returns the files the user-data script writes, decoded.
func decodedEnv(t *testing.T, script string) string {
	t.Helper()
	var b strings.Builder
	for _, m := range fileRE.FindAllStringSubmatch(script, -1) {
		d, err := base64.StdEncoding.DecodeString(m[1])
		require.NoError(t, err)
		b.Write(d)
		b.WriteString("\n")
	}
	return b.String()
}

// A create whose answer was lost (Compute Engine committed it) is retried
// by the reconciler; the retry meets the instance (409) and returns it.
func TestLostInsertAnswerIsRecovered(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.gce.LoseResponses("InsertInstance", 1)
	_, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.Error(t, err)
	require.Len(t, h.gce.Instances(), 1, "committed despite the error")
	inst, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	require.Equal(t, "web-0a1b2c3d", inst.InstanceID)
	require.Len(t, h.gce.Instances(), 1)
}

func TestProvisioningIsPending(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, nil)
	h.gce.Provisioning = 2
	inst, err := h.p.Create(ctx, request("web-0a1b2c3d", "web"))
	require.NoError(t, err)
	require.Equal(t, provider.StatePending, inst.State)
	require.Contains(t, inst.Message, "PROVISIONING")
	st, err := h.p.Status(ctx, "web-0a1b2c3d")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State)
}
