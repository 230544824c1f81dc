package gcp

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/api/option"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// KindName selects this provider in shard.infra.provider.
const KindName = "gcp"

// Provisioning models (Scheduling.provisioningModel).
const (
	ProvisioningStandard = "STANDARD"
	ProvisioningSpot     = "SPOT"
)

// Instance args (template or defaults args) that override Options per
// instance.
const (
	ArgImage             = "gcp.image"              // an image or image family URL
	ArgInstanceTemplate  = "gcp.instance_template"  // global/instanceTemplates/… or a full URL
	ArgProvisioningModel = "gcp.provisioning_model" // STANDARD or SPOT
	ArgServiceAccount    = "gcp.service_account"    // an email
	ArgNetworkTags       = "gcp.network_tags"       // comma-separated
)

// Defaults of Options.
const (
	DefaultDiskType = "pd-balanced"
	DefaultScope    = "https://www.googleapis.com/auth/cloud-platform"
)

// Options is shard.infra.options of the gcp kind. The zone is
// shard.infra.zone (a shard is one zone), the region shard.infra.region.
type Options struct {
	// Project is the Google Cloud project of the instances (required).
	Project string `json:"project"`
	// Endpoint overrides the Compute Engine endpoint (Private Service
	// Connect); empty: the default.
	Endpoint string `json:"endpoint"`
	// Image is the boot image (projects/…/global/images/… or
	// …/images/family/…), unless an instance template carries one.
	Image string `json:"image"`
	// InstanceTemplate, when set, is what instances are created from
	// (global/instanceTemplates/NAME, a regional one, or a full URL); the
	// request's own fields (name, labels, metadata, type, subnetwork)
	// override the template's.
	InstanceTemplate string `json:"instance_template"`
	// MachineType is used when the template/group names none.
	MachineType string `json:"machine_type"`
	// DiskSizeGB and DiskType of the boot disk made from Image (0: the
	// image's size; default pd-balanced).
	DiskSizeGB int64  `json:"disk_size_gb"`
	DiskType   string `json:"disk_type"`
	// Subnetwork is used when the instance's subnet pool names none
	// (regions/R/subnetworks/NAME or a full URL; empty: the network's
	// default).
	Subnetwork string `json:"subnetwork"`
	// ServiceAccount is the instances' service account (an email; empty:
	// none) with Scopes (default cloud-platform).
	ServiceAccount string   `json:"service_account"`
	Scopes         []string `json:"scopes"`
	// NetworkTags are the instances' network tags (firewall rules).
	NetworkTags []string `json:"network_tags"`
	// ProvisioningModel is STANDARD (default) or SPOT.
	ProvisioningModel string `json:"provisioning_model"`
	// Labels are added to every instance (ownership labels win).
	Labels map[string]string `json:"labels"`
	// Agent places the agent's files on the machine.
	Agent cloudinit.Agent `json:"agent"`
}

// Kind registers the Compute Engine provider.
func Kind() provider.Kind {
	return provider.Kind{Name: KindName, Config: func() provider.KindConfig { return DefaultOptions() }}
}

// DefaultOptions returns the options with every default set.
func DefaultOptions() *Options {
	return &Options{
		ProvisioningModel: ProvisioningStandard, DiskType: DefaultDiskType, Scopes: []string{DefaultScope},
		Agent: cloudinit.DefaultAgent(),
	}
}

const optionsKey = "shard.infra.options"

var (
	projectRE = regexp.MustCompile(`^[a-z][a-z0-9-]{4,28}[a-z0-9]$`)
	labelKey  = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	labelVal  = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
	tagRE     = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// Validate implements provider.KindConfig.
func (o *Options) Validate(cfg *config.Config) config.Errors {
	var errs config.Errors
	add := func(key, format string, args ...any) {
		errs = append(errs, config.FieldError{Key: key, Reason: fmt.Sprintf(format, args...)})
	}
	if cfg.Shard.Infra.Zone == "" {
		add("shard.infra.zone", "required by the gcp provider (a shard is one zone)")
	}
	if !projectRE.MatchString(o.Project) {
		add(optionsKey+".project", "want a project id (6-30 lowercase letters, digits and '-'), got %q", o.Project)
	}
	if o.ProvisioningModel != ProvisioningStandard && o.ProvisioningModel != ProvisioningSpot {
		add(optionsKey+".provisioning_model", "want %q or %q, got %q", ProvisioningStandard, ProvisioningSpot, o.ProvisioningModel)
	}
	if o.DiskSizeGB < 0 {
		add(optionsKey+".disk_size_gb", "must not be negative, got %d", o.DiskSizeGB)
	}
	for k, v := range o.Labels {
		if strings.HasPrefix(k, LabelPrefix) {
			add(optionsKey+".labels."+k, "reserved label key")
		} else if !labelKey.MatchString(k) || !labelVal.MatchString(v) {
			add(optionsKey+".labels."+k, "want a Compute Engine label (key: a lowercase letter then up to 62 of a-z, 0-9, _ and -; value: up to 63 of them), got %q=%q", k, v)
		}
	}
	for i, t := range o.NetworkTags {
		if !tagRE.MatchString(t) {
			add(fmt.Sprintf("%s.network_tags[%d]", optionsKey, i), "want a network tag (RFC 1035 label), got %q", t)
		}
	}
	agentErrs := o.Agent.Validate()
	for _, k := range slices.Sorted(maps.Keys(agentErrs)) {
		add(optionsKey+".agent."+k, "%s", agentErrs[k])
	}
	if len(cfg.Shard.DynamicSubnetPools) > 0 {
		add("shard.dynamic_subnet_pools", "not supported by the gcp provider (list subnetworks in shard.subnet_pools)")
	}
	for _, n := range cfg.TemplateNames() {
		args := cfg.TemplateArgs(n)
		spec, err := o.launchSpec(args)
		if err != nil {
			add("templates."+n+".args", "%v", err)
			continue
		}
		if spec.template == "" && cfg.Templates[n].InstanceType == "" && o.MachineType == "" {
			add("templates."+n+".instance_type", "required by the gcp provider when no instance template is used (or set shard.infra.options.machine_type)")
		}
	}
	return errs
}

// New implements provider.KindConfig: Compute Engine REST clients with the
// instance's service account (application default credentials).
func (o *Options) New(ctx context.Context, env provider.Env) (provider.Provider, error) {
	var opts []option.ClientOption
	if o.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(o.Endpoint))
	}
	client, err := NewClient(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return New(client, *o, env), nil
}
