package gcp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// Ownership labels on every instance. Label values allow only lowercase
// letters, digits, '_' and '-' (LabelValue folds the rest), so the exact
// values also travel as metadata items (Meta*), which decide ownership;
// the labels serve the server-side list filter.
const (
	LabelPrefix     = "nstance-"
	LabelCluster    = LabelPrefix + "cluster"
	LabelShard      = LabelPrefix + "shard"
	LabelTenant     = LabelPrefix + "tenant"
	LabelGroup      = LabelPrefix + "group"
	LabelTemplate   = LabelPrefix + "template"
	LabelInstanceID = LabelPrefix + "instance-id"

	MetaCluster    = "nstance-cluster"
	MetaShard      = "nstance-shard"
	MetaInstanceID = "nstance-instance-id"
	MetaProviderID = "nstance-provider-id"
	// MetaUserData is the key cloud-init's GCE data source reads.
	MetaUserData = "user-data"
)

// SpotNoticeEnv makes the agent watch the metadata server's
// instance/preempted (NSTANCE_SPOT_NOTICE=gcp).
const SpotNoticeEnv = "NSTANCE_SPOT_NOTICE=gcp"

// LabelValue folds s into a Compute Engine label value: lowercase, every
// character but a-z, 0-9, '_' and '-' replaced by '_', at most 63.
func LabelValue(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			b[i] = '_'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

// InstanceName is the Compute Engine name of an instance id: the id when
// it is an RFC 1035 label (a letter first), else "n" before it (cut to 63
// characters, no trailing '-').
func InstanceName(id string) string {
	if tagRE.MatchString(id) {
		return id
	}
	n := "n" + id
	if len(n) > 63 {
		n = n[:63]
	}
	return strings.TrimRight(n, "-")
}

// MaxUserData is Compute Engine's limit on one metadata value (256 KiB).
const MaxUserData = 256 << 10

// metadataPlatform is what cloudinit.Compose is told: a metadata value is a
// string, so the document is never gzip-compressed (binary would not
// survive the API's JSON); one above MaxUserData is refused by UserData.
var metadataPlatform = cloudinit.Platform{Name: "Compute Engine"}

// UserData is the metadata value user-data of req: the agent's bootstrap
// script (cloudinit.AgentScript), composed with the user's bootstrap data
// (cloudinit.Compose), refused above MaxUserData.
func UserData(agent cloudinit.Agent, req provider.CreateRequest, extra []string) ([]byte, error) {
	script, err := cloudinit.AgentScript(agent, req, extra)
	if err != nil {
		return nil, err
	}
	ud, err := cloudinit.Compose(script, req, metadataPlatform)
	if err != nil {
		return nil, err
	}
	if len(ud) > MaxUserData {
		return nil, fmt.Errorf("user data with the agent's bootstrap is %d bytes; a Compute Engine metadata value allows %d", len(ud), MaxUserData)
	}
	return ud, nil
}

// Provider manages the Compute Engine instances of one shard (one zone).
// Safe for concurrent use.
type Provider struct {
	api API
	o   Options
	env provider.Env
	log logr.Logger
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider calling api. o must have been validated.
func New(api API, o Options, env provider.Env) *Provider {
	return &Provider{api: api, o: o, env: env, log: env.Log}
}

// launchSpec is what one instance is made from, after args override the
// options.
type launchSpec struct {
	image, template, model, serviceAccount string
	tags                                   []string
}

func (o *Options) launchSpec(args map[string]string) (launchSpec, error) {
	s := launchSpec{image: o.Image, template: o.InstanceTemplate, model: o.ProvisioningModel, serviceAccount: o.ServiceAccount, tags: o.NetworkTags}
	if v := args[ArgImage]; v != "" {
		s.image = v
	}
	if v := args[provider.ArgImage]; v != "" {
		s.image = v
	}
	if v := args[ArgInstanceTemplate]; v != "" {
		s.template = v
	}
	if v := args[ArgProvisioningModel]; v != "" {
		if v != ProvisioningStandard && v != ProvisioningSpot {
			return s, fmt.Errorf("%s: want %q or %q, got %q", ArgProvisioningModel, ProvisioningStandard, ProvisioningSpot, v)
		}
		s.model = v
	}
	if v := args[ArgServiceAccount]; v != "" {
		s.serviceAccount = v
	}
	if v := args[ArgNetworkTags]; v != "" {
		s.tags = nil
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); !tagRE.MatchString(t) {
				return s, fmt.Errorf("%s: want network tags (RFC 1035 labels), got %q", ArgNetworkTags, t)
			}
			s.tags = append(s.tags, t)
		}
	}
	if s.image == "" && s.template == "" {
		return s, fmt.Errorf("no image: set shard.infra.options.image or instance_template, or the %s or %s arg", ArgImage, ArgInstanceTemplate)
	}
	return s, nil
}

func (p *Provider) owner() (cluster, shard, zone string) {
	cfg := p.env.Config()
	return cfg.Cluster.ID, cfg.Shard.ID, cfg.Shard.Infra.Zone
}

// subnetwork chooses the instance's subnetwork: one of its pool's,
// spread by a hash of the instance id (a replacement of the same id lands
// where the first try did), else Options.Subnetwork.
func (p *Provider) subnetwork(req provider.CreateRequest) (string, error) {
	if req.SubnetPool == "" {
		return p.o.Subnetwork, nil
	}
	pool, ok := p.env.Config().Shard.SubnetPools[req.SubnetPool]
	if !ok || len(pool.Subnets) == 0 {
		return "", fmt.Errorf("subnet pool %q: no subnetworks (shard.subnet_pools)", req.SubnetPool)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(req.InstanceID))
	return pool.Subnets[int(h.Sum32()%uint32(len(pool.Subnets)))], nil
}

func (p *Provider) labels(req provider.CreateRequest) map[string]string {
	m := map[string]string{}
	for k, v := range p.o.Labels {
		m[k] = v
	}
	m[LabelCluster], m[LabelShard], m[LabelInstanceID] = LabelValue(req.Cluster), LabelValue(req.Shard), LabelValue(req.InstanceID)
	for k, v := range map[string]string{LabelTenant: req.Tenant, LabelGroup: req.GroupID, LabelTemplate: req.Template} {
		if v != "" {
			m[k] = LabelValue(v)
		}
	}
	return m
}

// insertRequest builds the instances.insert request of req.
func (p *Provider) insertRequest(req provider.CreateRequest) (*computepb.InsertInstanceRequest, error) {
	spec, err := p.o.launchSpec(req.Args)
	if err != nil {
		return nil, err
	}
	subnet, err := p.subnetwork(req)
	if err != nil {
		return nil, err
	}
	ud, err := UserData(p.o.Agent, req, append(append([]string{}, p.env.Local.Env...), SpotNoticeEnv))
	if err != nil {
		return nil, err
	}
	_, _, zone := p.owner()
	inst := &computepb.Instance{
		Name:   proto.String(InstanceName(req.InstanceID)),
		Labels: p.labels(req),
		Metadata: &computepb.Metadata{Items: []*computepb.Items{
			{Key: proto.String(MetaCluster), Value: proto.String(req.Cluster)},
			{Key: proto.String(MetaInstanceID), Value: proto.String(req.InstanceID)},
			{Key: proto.String(MetaProviderID), Value: proto.String(req.ProviderID)},
			{Key: proto.String(MetaShard), Value: proto.String(req.Shard)},
			{Key: proto.String(MetaUserData), Value: proto.String(string(ud))},
		}},
	}
	mt := req.InstanceType
	if mt == "" {
		mt = p.o.MachineType
	}
	if mt != "" {
		inst.MachineType = proto.String("zones/" + zone + "/machineTypes/" + mt)
	}
	if spec.image != "" {
		disk := &computepb.AttachedDisk{Boot: proto.Bool(true), AutoDelete: proto.Bool(true),
			InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: proto.String(spec.image), Labels: p.labels(req)}}
		if p.o.DiskType != "" {
			disk.InitializeParams.DiskType = proto.String("zones/" + zone + "/diskTypes/" + p.o.DiskType)
		}
		if p.o.DiskSizeGB > 0 {
			disk.InitializeParams.DiskSizeGb = proto.Int64(p.o.DiskSizeGB)
		}
		inst.Disks = []*computepb.AttachedDisk{disk}
	}
	if subnet != "" {
		inst.NetworkInterfaces = []*computepb.NetworkInterface{{Subnetwork: proto.String(subnet)}}
	}
	if spec.serviceAccount != "" {
		inst.ServiceAccounts = []*computepb.ServiceAccount{{Email: proto.String(spec.serviceAccount), Scopes: p.o.Scopes}}
	}
	if len(spec.tags) > 0 {
		inst.Tags = &computepb.Tags{Items: spec.tags}
	}
	if spec.model == ProvisioningSpot {
		// A preempted spot VM is deleted (not stopped): the server
		// replaces it on the agent's notice and the listing confirms.
		inst.Scheduling = &computepb.Scheduling{ProvisioningModel: proto.String(ProvisioningSpot),
			InstanceTerminationAction: proto.String("DELETE"), AutomaticRestart: proto.Bool(false), OnHostMaintenance: proto.String("TERMINATE")}
	}
	out := &computepb.InsertInstanceRequest{Project: p.o.Project, Zone: zone, InstanceResource: inst}
	if spec.template != "" {
		out.SourceInstanceTemplate = proto.String(spec.template)
	}
	return out, nil
}

// Create implements provider.Provider. The instance's name derives from
// its id, so a repeated create (a lost answer, a new leader) meets the
// first one's instance (409) and returns it.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return provider.Instance{}, err
	}
	in, err := p.insertRequest(req)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	err = p.api.InsertInstance(ctx, in)
	if AlreadyExists(err) {
		inst, serr := p.Status(ctx, req.InstanceID)
		if serr != nil {
			return provider.Instance{}, fmt.Errorf("instances.insert %s: the name exists but is not this shard's instance: %w", in.InstanceResource.GetName(), serr)
		}
		return inst, nil
	}
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instances.insert %s: %w", in.InstanceResource.GetName(), err)
	}
	p.log.V(1).Info("created", "instance", req.InstanceID, "name", in.InstanceResource.GetName(),
		"subnetwork", firstSubnet(in.InstanceResource), "model", in.InstanceResource.GetScheduling().GetProvisioningModel())
	inst, err := p.Status(ctx, req.InstanceID)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("instance %s created but not readable: %w", req.InstanceID, err)
	}
	return inst, nil
}

func firstSubnet(i *computepb.Instance) string {
	if len(i.GetNetworkInterfaces()) == 0 {
		return ""
	}
	return i.GetNetworkInterfaces()[0].GetSubnetwork()
}

// get returns the instance named for id when it is this shard's (nil,
// nil when there is none).
func (p *Provider) get(ctx context.Context, id string) (*computepb.Instance, error) {
	_, _, zone := p.owner()
	i, err := p.api.GetInstance(ctx, &computepb.GetInstanceRequest{Project: p.o.Project, Zone: zone, Instance: InstanceName(id)})
	if NotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("instances.get %s: %w", InstanceName(id), err)
	}
	if !p.ours(i) || Meta(i, MetaInstanceID) != id {
		return nil, nil
	}
	return i, nil
}

func (p *Provider) ours(i *computepb.Instance) bool {
	cluster, shard, _ := p.owner()
	return owned(i, cluster, shard)
}

// owned: the exact metadata values, not the folded labels, decide.
func owned(i *computepb.Instance, cluster, shard string) bool {
	return Meta(i, MetaCluster) == cluster && Meta(i, MetaShard) == shard
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	i, err := p.get(ctx, id)
	if err != nil {
		return provider.Instance{}, err
	}
	if i == nil {
		return provider.Instance{}, fmt.Errorf("%w: %s", provider.ErrNotFound, id)
	}
	return ToInstance(i), nil
}

// OwnerFilter is the instances.list filter of a cluster's shard.
func OwnerFilter(cluster, shard string) string {
	return fmt.Sprintf(`(labels.%s = "%s") AND (labels.%s = "%s")`, LabelCluster, LabelValue(cluster), LabelShard, LabelValue(shard))
}

// ListOwned returns the instances of a cluster's shard in a zone: the
// label filter (OwnerFilter) narrows the list, the exact metadata decides,
// so one labelled alike by another cluster or by hand is left out.
func ListOwned(ctx context.Context, api API, project, zone, cluster, shard string) ([]*computepb.Instance, error) {
	found, err := api.ListInstances(ctx, &computepb.ListInstancesRequest{Project: project, Zone: zone, Filter: proto.String(OwnerFilter(cluster, shard))})
	if err != nil {
		return nil, fmt.Errorf("instances.list: %w", err)
	}
	out := found[:0]
	for _, i := range found {
		if owned(i, cluster, shard) && Meta(i, MetaInstanceID) != "" {
			out = append(out, i)
		}
	}
	return out, nil
}

// List implements provider.Provider: every instance of this cluster and
// shard in the zone (ListOwned), sorted by instance id.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	cluster, shard, zone := p.owner()
	found, err := ListOwned(ctx, p.api, p.o.Project, zone, cluster, shard)
	if err != nil {
		return nil, err
	}
	out := make([]provider.Instance, 0, len(found))
	for _, i := range found {
		out = append(out, ToInstance(i))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].InstanceID < out[b].InstanceID })
	return out, nil
}

// Delete implements provider.Provider; an instance already gone is not
// an error.
func (p *Provider) Delete(ctx context.Context, id string) error {
	i, err := p.get(ctx, id)
	if err != nil || i == nil {
		return err
	}
	_, _, zone := p.owner()
	err = p.api.DeleteInstance(ctx, &computepb.DeleteInstanceRequest{Project: p.o.Project, Zone: zone, Instance: i.GetName()})
	if err != nil && !NotFound(err) {
		return fmt.Errorf("instances.delete %s (%s): %w", i.GetName(), id, err)
	}
	return nil
}

// Meta returns the value of an instance's metadata item ("" if absent).
func Meta(i *computepb.Instance, key string) string {
	for _, it := range i.GetMetadata().GetItems() {
		if it.GetKey() == key {
			return it.GetValue()
		}
	}
	return ""
}

// ToInstance maps a Compute Engine instance to the provider's view:
// PROVISIONING, STAGING and REPAIRING → pending, RUNNING → running, the
// stopping, suspended and terminated states → stopped.
func ToInstance(i *computepb.Instance) provider.Instance {
	out := provider.Instance{InstanceID: Meta(i, MetaInstanceID), ProviderID: Meta(i, MetaProviderID), State: provider.StatePending}
	switch i.GetStatus() {
	case "RUNNING":
		out.State = provider.StateRunning
	case "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED":
		out.State = provider.StateStopped
	}
	msg := []string{"gce " + i.GetName() + " " + i.GetStatus()}
	if i.GetScheduling().GetProvisioningModel() == ProvisioningSpot {
		msg = append(msg, "spot")
	}
	if m := i.GetStatusMessage(); m != "" && i.GetStatus() != "RUNNING" {
		msg = append(msg, m)
	}
	out.Message = strings.Join(msg, "; ")
	seen := map[string]bool{}
	add := func(v string) {
		if v != "" && !seen[v] {
			seen[v] = true
			out.Addresses = append(out.Addresses, v)
		}
	}
	for _, ni := range i.GetNetworkInterfaces() {
		add(ni.GetNetworkIP())
	}
	for _, ni := range i.GetNetworkInterfaces() {
		add(ni.GetIpv6Address())
		for _, ac := range ni.GetAccessConfigs() {
			add(ac.GetNatIP())
		}
	}
	return out
}

// errNoInterface: the instance lacks the network interface named.
var errNoInterface = errors.New("no such network interface")
