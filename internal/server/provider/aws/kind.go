package aws

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// KindName selects this provider in shard.infra.provider.
const KindName = "aws"

// Market values.
const (
	MarketOnDemand = "on-demand"
	MarketSpot     = "spot"
)

// Retry modes of the SDK client.
const (
	RetryAdaptive = "adaptive"
	RetryStandard = "standard"
)

// Defaults of Options.
const (
	DefaultMaxAttempts       = 10
	DefaultMaxBackoff        = 20 * time.Second
	DefaultVisibilityTimeout = 2 * time.Minute
)

// Instance args (template or defaults args) that override Options per
// instance, so each group's template picks its own image or launch template.
const (
	ArgImageID               = "aws.image_id"
	ArgLaunchTemplate        = "aws.launch_template"         // id (lt-…) or name
	ArgLaunchTemplateVersion = "aws.launch_template_version" // number, $Latest or $Default
	ArgMarket                = "aws.market"                  // on-demand or spot
	ArgSpotMaxPrice          = "aws.spot_max_price"
	ArgSecurityGroupIDs      = "aws.security_group_ids" // comma-separated
	ArgIAMInstanceProfile    = "aws.iam_instance_profile"
	ArgKeyName               = "aws.key_name"
)

// LaunchTemplate names an EC2 launch template.
type LaunchTemplate struct {
	// ID (lt-…) or Name; one of them.
	ID   string `json:"id"`
	Name string `json:"name"`
	// Version is a number, $Latest or $Default (default: the template's default).
	Version string `json:"version"`
}

// Options is shard.infra.options of the aws kind. Region is shard.infra.region.
type Options struct {
	// Endpoint overrides the EC2 endpoint (a VPC endpoint); empty: the region's.
	Endpoint string `json:"endpoint"`
	// LaunchTemplate, when set, is what instances are launched from.
	LaunchTemplate LaunchTemplate `json:"launch_template"`
	// ImageID is the AMI (required unless a launch template carries one).
	ImageID string `json:"image_id"`
	// InstanceType is used when the template/group names none.
	InstanceType string `json:"instance_type"`
	// SecurityGroupIDs of the instances' primary interface.
	SecurityGroupIDs []string `json:"security_group_ids"`
	// IAMInstanceProfile is a profile name or ARN.
	IAMInstanceProfile string `json:"iam_instance_profile"`
	// KeyName is an EC2 key pair.
	KeyName string `json:"key_name"`
	// Market is on-demand (default) or spot.
	Market string `json:"market"`
	// SpotMaxPrice caps the spot price (default: the on-demand price).
	SpotMaxPrice string `json:"spot_max_price"`
	// Tags are added to every instance and volume (ownership tags win).
	Tags map[string]string `json:"tags"`
	// Agent places the agent's files on the machine.
	Agent Agent `json:"agent"`
	// RetryMode is adaptive (default: client-side rate limiting after
	// throttling) or standard.
	RetryMode string `json:"retry_mode"`
	// MaxAttempts per SDK call, retries included (default 10).
	MaxAttempts int `json:"max_attempts"`
	// MaxBackoff caps the SDK's delay between attempts (default 20s).
	MaxBackoff config.Duration `json:"max_backoff"`
	// VisibilityTimeout is how long a create waits for the new instance to
	// show in DescribeInstances (default 2m).
	VisibilityTimeout config.Duration `json:"visibility_timeout"`
	// Images are AMIs looked up by name (DescribeImages), named by
	// templates with the image_name arg.
	Images map[string]Image `json:"images"`
	// ImageRefreshInterval is how long a looked-up image is used before
	// the next lookup (default 1h).
	ImageRefreshInterval config.Duration `json:"image_refresh_interval"`
	// SubnetMinFreeAddresses is the floor of free addresses
	// (AvailableIpAddressCount) below which a subnet of a pool takes no
	// new instance (default 8).
	SubnetMinFreeAddresses int `json:"subnet_min_free_addresses"`
	// SubnetRefreshInterval is how long free address counts and the
	// subnets of dynamic pools are used before DescribeSubnets again
	// (default 1m).
	SubnetRefreshInterval config.Duration `json:"subnet_refresh_interval"`
}

// Kind registers the EC2 provider.
func Kind() provider.Kind {
	return provider.Kind{Name: KindName, Config: func() provider.KindConfig { return DefaultOptions() }}
}

// DefaultOptions returns the options with every default set.
func DefaultOptions() *Options {
	return &Options{
		Market: MarketOnDemand, RetryMode: RetryAdaptive, MaxAttempts: DefaultMaxAttempts,
		MaxBackoff: config.Duration(DefaultMaxBackoff), VisibilityTimeout: config.Duration(DefaultVisibilityTimeout),
		Agent: cloudinit.DefaultAgent(),
	}
}

const optionsKey = "shard.infra.options"

// Validate implements provider.KindConfig: besides the block itself, every
// template must resolve to an image or a launch template and every subnet
// pool must name subnets.
func (o *Options) Validate(cfg *config.Config) config.Errors {
	var errs config.Errors
	add := func(key, format string, args ...any) {
		errs = append(errs, config.FieldError{Key: key, Reason: fmt.Sprintf(format, args...)})
	}
	if cfg.Shard.Infra.Region == "" {
		add("shard.infra.region", "required by the aws provider")
	}
	if lt := o.LaunchTemplate; lt.ID != "" && lt.Name != "" {
		add(optionsKey+".launch_template", "set id or name, not both")
	}
	if o.LaunchTemplate.ID != "" && !strings.HasPrefix(o.LaunchTemplate.ID, "lt-") {
		add(optionsKey+".launch_template.id", "want lt-…, got %q", o.LaunchTemplate.ID)
	}
	if o.ImageID != "" && !strings.HasPrefix(o.ImageID, "ami-") {
		add(optionsKey+".image_id", "want ami-…, got %q", o.ImageID)
	}
	for i, sg := range o.SecurityGroupIDs {
		if !strings.HasPrefix(sg, "sg-") {
			add(fmt.Sprintf("%s.security_group_ids[%d]", optionsKey, i), "want sg-…, got %q", sg)
		}
	}
	if o.Market != MarketOnDemand && o.Market != MarketSpot {
		add(optionsKey+".market", "want %q or %q, got %q", MarketOnDemand, MarketSpot, o.Market)
	}
	if o.RetryMode != RetryAdaptive && o.RetryMode != RetryStandard {
		add(optionsKey+".retry_mode", "want %q or %q, got %q", RetryAdaptive, RetryStandard, o.RetryMode)
	}
	if o.MaxAttempts < 1 {
		add(optionsKey+".max_attempts", "must be at least 1, got %d", o.MaxAttempts)
	}
	if o.MaxBackoff <= 0 {
		add(optionsKey+".max_backoff", "must be positive, got %s", o.MaxBackoff.D())
	}
	if o.VisibilityTimeout <= 0 {
		add(optionsKey+".visibility_timeout", "must be positive, got %s", o.VisibilityTimeout.D())
	}
	for k := range o.Tags {
		if strings.HasPrefix(k, TagPrefix) || strings.HasPrefix(strings.ToLower(k), "aws:") {
			add(optionsKey+".tags."+k, "reserved tag key")
		}
	}
	agentErrs := o.Agent.Validate()
	for _, k := range slices.Sorted(maps.Keys(agentErrs)) {
		add(optionsKey+".agent."+k, "%s", agentErrs[k])
	}
	o.validateImages(add)
	if o.SubnetMinFreeAddresses < 0 {
		add(optionsKey+".subnet_min_free_addresses", "must not be negative, got %d", o.SubnetMinFreeAddresses)
	}
	if o.SubnetRefreshInterval < 0 {
		add(optionsKey+".subnet_refresh_interval", "must not be negative, got %s", o.SubnetRefreshInterval.D())
	}
	names := make([]string, 0, len(cfg.Shard.SubnetPools))
	for n := range cfg.Shard.SubnetPools {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for i, s := range cfg.Shard.SubnetPools[n].Subnets {
			if !strings.HasPrefix(s, "subnet-") {
				add(fmt.Sprintf("shard.subnet_pools.%s.subnets[%d]", n, i), "want subnet-…, got %q", s)
			}
		}
	}
	for _, n := range cfg.TemplateNames() {
		args := cfg.TemplateArgs(n)
		if name := args[provider.ArgImageName]; name != "" {
			if _, ok := o.Images[name]; !ok {
				add("templates."+n+".args", "%s %q is not in %s.images", provider.ArgImageName, name, optionsKey)
				continue
			}
			if args[provider.ArgImage] == "" {
				args[provider.ArgImage] = "ami-resolved-at-run-time"
			}
		}
		spec, err := o.launchSpec(args)
		if err != nil {
			add("templates."+n+".args", "%v", err)
			continue
		}
		// Without a launch template EC2 would pick its own default type.
		if spec.launchTemplate.ID == "" && spec.launchTemplate.Name == "" && cfg.Templates[n].InstanceType == "" && o.InstanceType == "" {
			add("templates."+n+".instance_type", "required by the aws provider when no launch template is used (or set shard.infra.options.instance_type)")
		}
	}
	return errs
}

// New implements provider.KindConfig: an EC2 client for shard.infra.region
// with credentials from the default chain (instance profile on EC2).
func (o *Options) New(ctx context.Context, env provider.Env) (provider.Provider, error) {
	client, err := NewClient(ctx, *o, env.Config().Shard.Infra.Region)
	if err != nil {
		return nil, err
	}
	return New(client, *o, env), nil
}

// NewClient returns the EC2 client the provider uses: region, endpoint and
// the retryer from o; extra load options (tests: static credentials) are
// applied last.
func NewClient(ctx context.Context, o Options, region string, extra ...func(*awsconfig.LoadOptions) error) (*ec2.Client, error) {
	load := append([]func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(region),
		awsconfig.WithRetryer(func() awssdk.Retryer { return NewRetryer(o) }),
	}, extra...)
	cfg, err := awsconfig.LoadDefaultConfig(ctx, load...)
	if err != nil {
		return nil, fmt.Errorf("loading AWS config: %w", err)
	}
	return ec2.NewFromConfig(cfg, func(eo *ec2.Options) {
		if o.Endpoint != "" {
			eo.BaseEndpoint = awssdk.String(o.Endpoint)
		}
	}), nil
}

// NewRetryer is the SDK retryer of o: standard retries (throttling codes
// such as RequestLimitExceeded, 5xx, connection errors) with exponential
// jittered backoff up to MaxBackoff, in adaptive mode also a client-side
// send rate that drops after throttling.
func NewRetryer(o Options) awssdk.Retryer {
	std := func(so *retry.StandardOptions) {
		so.MaxAttempts = o.MaxAttempts
		so.MaxBackoff = o.MaxBackoff.D()
		so.Backoff = retry.NewExponentialJitterBackoff(o.MaxBackoff.D())
	}
	if o.RetryMode == RetryStandard {
		return retry.NewStandard(std)
	}
	return retry.NewAdaptiveMode(func(ao *retry.AdaptiveModeOptions) {
		ao.StandardOptions = append(ao.StandardOptions, std)
	})
}
