package config

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"
)

// Duration is a time.Duration written in JSON as a Go duration string ("15s").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalJSON accepts a duration string such as "1m30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"30s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Config is the whole shard configuration document.
type Config struct {
	Cluster      Cluster                     `json:"cluster"`
	Shard        Shard                       `json:"shard"`
	Certificates Certificates                `json:"certificates"`
	Defaults     Defaults                    `json:"defaults"`
	Templates    map[string]Template         `json:"templates"`
	Groups       map[string]map[string]Group `json:"groups"`
	// Tenants declares the tenants this shard serves. Optional: tenants
	// are otherwise implicit (an operator's is its nonce's) and only named
	// by groups and templates' tenants lists (see NamedTenants). Declared,
	// a template without a tenants list is open to these tenants only.
	Tenants []string `json:"tenants"`
	// InstanceTypes is the instance-type catalog: what one machine of each
	// type offers a Kubernetes node, published for scale from zero. It
	// answers before the provider's own lookup (AWS DescribeInstanceTypes),
	// and is the only source for the local providers.
	InstanceTypes map[string]InstanceType `json:"instance_types"`
	// LoadBalancers are the load balancers group members register with,
	// by name (see LoadBalancer); templates and static groups name theirs.
	LoadBalancers map[string]LoadBalancer `json:"load_balancers"`
}

// InstanceType is one entry of the instance-type catalog.
type InstanceType struct {
	VCPUs     int32 `json:"vcpus"`
	MemoryMiB int64 `json:"memory_mib"`
	// GPUs counts NVIDIA GPUs (nvidia.com/gpu).
	GPUs                int32 `json:"gpus"`
	EphemeralStorageGiB int64 `json:"ephemeral_storage_gib"`
	// Pods is the node's pod capacity (default 110, the kubelet's).
	Pods int32 `json:"pods"`
	// Arch is amd64 (default), arm64, s390x or ppc64le; OS is linux
	// (default) or windows.
	Arch string `json:"arch"`
	OS   string `json:"os"`
}

// Cluster holds settings shared by every shard of the cluster.
type Cluster struct {
	ID             string         `json:"id"`
	Storage        Storage        `json:"storage"`
	Secrets        Secrets        `json:"secrets"`
	LeaderElection LeaderElection `json:"leader_election"`
}

// Storage describes the object storage the cluster uses. The server is told
// where its storage is by flags (it must read this file from there); this
// block documents it and is checked against the flags when set.
type Storage struct {
	Kind   string `json:"kind"` // s3, gcs or file
	Bucket string `json:"bucket"`
	Prefix string `json:"prefix"`
}

// Secrets says where the encryption key for secrets at rest comes from.
type Secrets struct {
	EncryptionKey KeySource   `json:"encryption_key"`
	PreviousKeys  []KeySource `json:"previous_keys"`
}

// KeySource locates one 32-byte encryption key.
type KeySource struct {
	// Provider is "env", "file", "aws-secrets-manager", "aws-ssm" or
	// "gcp-secret-manager".
	Provider string `json:"provider"`
	// Env is the environment variable for provider env (default NSTANCE_ENCRYPTION_KEY).
	Env string `json:"env"`
	// File is the path for provider file.
	File string `json:"file"`
	// SecretID is the Secrets Manager secret name or ARN (provider
	// aws-secrets-manager); VersionStage (default AWSCURRENT) or VersionID
	// pick one version of it, so a previous key can name AWSPREVIOUS.
	// For gcp-secret-manager SecretID is projects/PROJECT/secrets/NAME and
	// VersionID a version number (default latest).
	SecretID     string `json:"secret_id"`
	VersionStage string `json:"version_stage"`
	VersionID    string `json:"version_id"`
	// Parameter is the SSM Parameter Store name (provider aws-ssm),
	// optionally with a version selector ("/nstance/key:3"); SecureString
	// parameters are decrypted.
	Parameter string `json:"parameter"`
	// Region overrides the AWS region for the AWS providers (default: the
	// SDK's region chain, AWS_REGION or the instance metadata).
	Region string `json:"region"`
}

// LeaderElection sets the lease timings for cluster and shard elections.
type LeaderElection struct {
	LeaseDuration Duration `json:"lease_duration"`
	RenewInterval Duration `json:"renew_interval"`
	// RenewDeadline is how long a leader goes on acting without a
	// successful renewal; strictly between renew_interval and
	// lease_duration (default two thirds of the lease).
	RenewDeadline Duration `json:"renew_deadline"`
	// MaxClockSkew is the assumed bound on clock differences between
	// servers; a standby waits lease_duration plus this before taking over.
	MaxClockSkew  Duration `json:"max_clock_skew"`
	RetryInterval Duration `json:"retry_interval"`
}

// Shard holds the settings of this zone shard.
type Shard struct {
	ID        string    `json:"id"`
	Infra     Infra     `json:"infra"`
	Bind      Bind      `json:"bind"`
	Advertise Advertise `json:"advertise"`
	Timeouts  Timeouts  `json:"timeouts"`
	// Registration tunes the checks on agent registrations.
	Registration        Registration `json:"registration"`
	HealthCheckInterval Duration     `json:"health_check_interval"`
	// HealthMisses is how many missed reports make an instance unhealthy
	// (0: the default, 3).
	HealthMisses int `json:"health_misses"`
	// AgentStartupGrace is how long a new instance may take to send its first
	// health report (0: the default, 5m).
	AgentStartupGrace Duration `json:"agent_startup_grace"`
	// AgentReconnectGrace is how long after a server becomes leader the
	// agents of instances already running have to reconnect and report
	// before it judges their health: they were connected to the old leader
	// and come back with jittered backoff (0: agent_startup_grace).
	AgentReconnectGrace Duration `json:"agent_reconnect_grace"`
	// ShutdownGrace is how long after an agent reported that its host is
	// shutting down the provider has to confirm it (stopped or gone) before
	// the member is replaced anyway (0: the default, 1m; a VM whose
	// provider cannot see a guest shutdown is replaced after this).
	ShutdownGrace Duration `json:"shutdown_grace"`
	// RotationSurge is how many instances beyond its size a group may run
	// while rotating drifted members (0: the default, 1).
	RotationSurge       int                   `json:"rotation_surge"`
	DefaultDrainTimeout Duration              `json:"default_drain_timeout"`
	CreateRateLimit     RateLimit             `json:"create_rate_limit"`
	SubnetPools         map[string]SubnetPool `json:"subnet_pools"`
	// DynamicSubnetPools are subnet pools whose subnets the provider finds
	// by tags (aws: DescribeSubnets), refreshed periodically; templates and
	// groups name them as they name subnet_pools.
	DynamicSubnetPools map[string]DynamicSubnetPool `json:"dynamic_subnet_pools"`
	GarbageCollection  GarbageCollection            `json:"garbage_collection"`
	Expiry             Expiry                       `json:"expiry"`
	Limits             Limits                       `json:"limits"`
	// LeaderAddress is the fixed address the shard leader holds while it
	// leads (none by default).
	LeaderAddress LeaderAddress `json:"leader_address"`
	// InstanceDomain, when set, is the DNS domain instances' FQDNs are under
	// (template data .Instance.FQDN = {instance id}.{instance_domain}).
	InstanceDomain string `json:"instance_domain"`
	// FileSources tunes how secret and storage file contents are cached.
	FileSources FileSources `json:"file_sources"`
}

// Leader address modes.
const (
	LeaderAddressNone   = "none"
	LeaderAddressVIP    = "vip"
	LeaderAddressAWSENI = "aws-eni"
	// LeaderAddressGCPAlias is a reserved internal address that the leader
	// carries as an alias IP range (Google Cloud).
	LeaderAddressGCPAlias = "gcp-alias-ip"
)

// LeaderAddress is the shard's fixed address, held by its leader only: a
// Linux virtual IP (mode vip), an AWS network interface (mode aws-eni) or a
// Google Cloud alias IP range (mode gcp-alias-ip).
type LeaderAddress struct {
	// Mode is "none" (default), "vip", "aws-eni" or "gcp-alias-ip".
	Mode string `json:"mode"`
	// Interface is the Linux interface the VIP is added to (mode vip).
	Interface string `json:"interface"`
	// Address is the VIP with its prefix length, e.g. "10.0.0.10/24"
	// (mode vip, IPv4).
	Address string `json:"address"`
	// NetworkInterfaceID is the ENI attached to the leader (mode aws-eni).
	NetworkInterfaceID string `json:"network_interface_id"`
	// DeviceIndex is the ENI's device index on the leader (mode aws-eni,
	// default 1).
	DeviceIndex int `json:"device_index"`
	// GCPAddress is the reserved internal address the leader carries as a
	// /32 alias IP range on nic0 (mode gcp-alias-ip): its name, in the
	// shard's region and the gcp provider's project, or
	// projects/P/regions/R/addresses/NAME.
	GCPAddress string `json:"gcp_address"`
}

// Infra selects the provider that creates instances.
type Infra struct {
	Provider string         `json:"provider"`
	Region   string         `json:"region"`
	Zone     string         `json:"zone"`
	Options  map[string]any `json:"options"`
}

// Bind lists the listen addresses of the five server ports.
type Bind struct {
	HealthAddr       string `json:"health_addr"`
	ElectionAddr     string `json:"election_addr"`
	RegistrationAddr string `json:"registration_addr"`
	OperatorAddr     string `json:"operator_addr"`
	AgentAddr        string `json:"agent_addr"`
}

// Advertise lists the addresses clients use to reach this server; they also
// go into the server certificate as SANs.
type Advertise struct {
	Hosts            []string `json:"hosts"`
	RegistrationAddr string   `json:"registration_addr"`
	AgentAddr        string   `json:"agent_addr"`
	OperatorAddr     string   `json:"operator_addr"`
}

// Timeouts bounds provider and storage calls.
type Timeouts struct {
	ProviderCall Duration `json:"provider_call"`
	StorageCall  Duration `json:"storage_call"`
	Registration Duration `json:"registration"`
	Shutdown     Duration `json:"shutdown"`
}

// Registration tunes how an agent registration is checked against what the
// provider reported for its instance.
type Registration struct {
	// SourceAddressCheck is "enforce" (the default; empty means enforce) or
	// "off". Enforced, an agent whose instance has provider-reported
	// addresses must connect from one of them.
	SourceAddressCheck string `json:"source_address_check"`
	// TrustedProxies are CIDRs (or single addresses) of NAT gateways or load
	// balancers in front of the Registration port: connections from them are
	// not checked, their source address says nothing about the instance.
	TrustedProxies []string `json:"trusted_proxies"`
}

// SourceCheckOff reports whether the source-address check is turned off.
func (r Registration) SourceCheckOff() bool { return r.SourceAddressCheck == "off" }

// Proxies parses TrustedProxies (validated by Validate; bad entries are skipped).
func (r Registration) Proxies() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range r.TrustedProxies {
		if p, err := parsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// RateLimit bounds how fast instances are created.
type RateLimit struct {
	PerMinute int `json:"per_minute"`
	Burst     int `json:"burst"`
}

// SubnetPool is a named set of subnets instances are placed in.
type SubnetPool struct {
	Subnets []string `json:"subnets"`
}

// DynamicSubnetPool is a subnet pool defined by tags: every subnet carrying
// all of them (in the shard's region) belongs to it.
type DynamicSubnetPool struct {
	Tags map[string]string `json:"tags"`
}

// HasSubnetPool reports whether name is a static or a dynamic subnet pool.
func (s *Shard) HasSubnetPool(name string) bool {
	if _, ok := s.SubnetPools[name]; ok {
		return true
	}
	_, ok := s.DynamicSubnetPools[name]
	return ok
}

// GarbageCollection controls removal of orphaned provider instances (the
// provider's instances of this shard without a record) and of stored user
// data no group or instance names. It is on unless enabled is false; a pass
// runs at most every interval (default 5m) and removes only what stayed
// unclaimed for grace_period (default 30m).
type GarbageCollection struct {
	// Enabled turns collection off when false (nil: on).
	Enabled     *bool    `json:"enabled"`
	Interval    Duration `json:"interval"`
	GracePeriod Duration `json:"grace_period"`
}

// Garbage collection defaults.
const (
	DefaultGCInterval    = 5 * time.Minute
	DefaultGCGracePeriod = 30 * time.Minute
)

// WithDefaults returns g with its defaults filled in: on, every 5 minutes,
// a 30 minute grace period.
func (g GarbageCollection) WithDefaults() GarbageCollection {
	if g.Enabled == nil {
		g.Enabled = new(true)
	}
	setDur(&g.Interval, DefaultGCInterval)
	setDur(&g.GracePeriod, DefaultGCGracePeriod)
	return g
}

// On reports whether collection runs (defaults applied).
func (g GarbageCollection) On() bool { return g.Enabled == nil || *g.Enabled }

// Expiry controls instance replacement by age.
type Expiry struct {
	EligibleAge Duration `json:"eligible_age"`
	ForcedAge   Duration `json:"forced_age"`
	OndemandAge Duration `json:"ondemand_age"`
}

// Certificates sets certificate and nonce lifetimes.
type Certificates struct {
	CAValidity       Duration `json:"ca_validity"`
	ServerValidity   Duration `json:"server_validity"`
	AgentValidity    Duration `json:"agent_validity"`
	OperatorValidity Duration `json:"operator_validity"`
	AgentNonceTTL    Duration `json:"agent_nonce_ttl"`
	// NonceMaxLifetime is the longest lifetime (exp - iat) of a registration
	// nonce the server accepts, agent or operator (default 24h, at most
	// 720h). Shards may differ: each nonce's used-marker carries the
	// nonce's own expiry, which every sweep honours.
	NonceMaxLifetime Duration `json:"nonce_max_lifetime"`
	// RevocationSyncInterval is how often the shard leader re-reads the
	// revocation entries and operator records from storage (default 10s):
	// what another server revoked, or an operator record deleted by hand,
	// is refused within it.
	RevocationSyncInterval Duration `json:"revocation_sync_interval"`
	// DeniedGroups are subject organizations (Kubernetes groups) no
	// template certificate may carry, whatever CA signs it; system:masters
	// is always denied, this list adds to it.
	DeniedGroups []string `json:"denied_groups"`
}

// Defaults apply to every template.
type Defaults struct {
	Args map[string]string `json:"args"`
	Vars map[string]string `json:"vars"`
}

// Template describes how instances of a kind are built.
type Template struct {
	Kind  string                  `json:"kind"`
	Arch  string                  `json:"arch"`
	Files map[string]TemplateFile `json:"files"`
	Keys  map[string]TemplateKey  `json:"keys"`
	Args  map[string]string       `json:"args"`
	// Userdata is the instance's own bootstrap data (e.g. a script that
	// joins it to a Kubernetes cluster), a Go template over the instance's
	// TemplateData rendered per instance. It runs after the agent's own
	// bootstrap and cannot replace it. Bootstrap data a caller sends
	// (UpsertGroup, CreateInstance) takes its place.
	Userdata string `json:"userdata"`
	// UserdataObject names an object in the cluster's bucket holding the
	// userdata template instead (mutually exclusive with userdata).
	UserdataObject string            `json:"userdata_object"`
	Size           int               `json:"size"`
	InstanceType   string            `json:"instance_type"`
	SubnetPool     string            `json:"subnet_pool"`
	Vars           map[string]string `json:"vars"`
	// LoadBalancers names load_balancers entries every member of a group of
	// this template registers with after its first healthy report (a static
	// group's own list replaces it).
	LoadBalancers []string `json:"load_balancers"`
	// Tenants are the tenants that may use this template (UpsertGroup,
	// CreateInstance, static groups). Left out, the template is open to
	// every tenant, which validation allows only while the config names at
	// most one tenant (see Config.Tenants); with more, it is required.
	Tenants []string `json:"tenants"`
}

// TemplateFile is one file delivered to the agent.
type TemplateFile struct {
	// Kind is certificate, ca_bundle, secret, storage, env, json or string.
	Kind string `json:"kind"`
	// Path is relative to the agent data directory.
	Path string `json:"path"`
	// Mode is the octal permission string, e.g. "0600".
	Mode string `json:"mode"`
	// Content is the literal or templated content (env, json, string).
	Content string `json:"content"`
	// Key names the generated key a certificate file is issued for.
	Key string `json:"key"`
	// Secret names a stored secret for kind secret.
	Secret string `json:"secret"`
	// Source is where a secret file's value comes from: "cluster" (the
	// default: Secret names a file secret in the cluster's encrypted
	// store), "aws-secrets-manager" (SecretID with VersionStage or
	// VersionID) or "aws-ssm" (Parameter, decrypted). Region overrides the
	// AWS region. Checked in filesources.go.
	Source       string `json:"source"`
	SecretID     string `json:"secret_id"`
	VersionStage string `json:"version_stage"`
	VersionID    string `json:"version_id"`
	Parameter    string `json:"parameter"`
	Region       string `json:"region"`
	// Object is the key (below the storage prefix) of the object a file of
	// kind storage delivers; Template renders it as a Go template first.
	Object   string `json:"object"`
	Template bool   `json:"template"`
}

// TemplateKey is one key the agent generates.
type TemplateKey struct {
	// Type is ed25519, ecdsa-p256, ecdsa-p384, rsa-2048 or rsa-4096.
	Type        string               `json:"type"`
	Certificate *TemplateCertificate `json:"certificate"`
}

// TemplateCertificate is the certificate the server issues for a generated key.
type TemplateCertificate struct {
	// CA names the CA that signs it: "" or "workload" for the workload CA,
	// or the name of a CA the admin imported (`nstance-admin cluster ca
	// import`), such as the workload Kubernetes cluster's CA for kubelet
	// certificates. Never the cluster CA.
	CA string `json:"ca"`
	// Organization and OrganizationalUnits set the subject's O and OU
	// (Kubernetes reads O as the user's groups). Only certificates of an
	// imported CA may set them; a workload certificate's O is its tenant.
	Organization        []string `json:"organization"`
	OrganizationalUnits []string `json:"organizational_units"`
	// TenantVars names the vars a tenant (UpsertGroup, CreateInstance) may
	// set that this certificate's subject and names may depend on. The
	// names of a certificate of an imported CA are rendered with the
	// config's vars only (defaults, template, static group) plus these.
	TenantVars  []string `json:"tenant_vars"`
	CommonName  string   `json:"common_name"`
	Usages      []string `json:"usages"`
	DNSNames    []string `json:"dns_names"`
	IPAddresses []string `json:"ip_addresses"`
	URIs        []string `json:"uris"`
	Validity    Duration `json:"validity"`
}

// Group is a static group of instances of one template.
type Group struct {
	Template     string            `json:"template"`
	Size         int               `json:"size"`
	InstanceType string            `json:"instance_type"`
	SubnetPool   string            `json:"subnet_pool"`
	Vars         map[string]string `json:"vars"`
	// DrainTimeout bounds how long a member is drained before it is
	// deleted: unset means shard.default_drain_timeout, 0 disables the
	// drain (members are deleted at once, without a pending-deletion
	// announcement).
	DrainTimeout *Duration `json:"drain_timeout"`
	// LoadBalancers replaces the template's load_balancers for this group
	// when set ([] registers with none).
	LoadBalancers []string `json:"load_balancers"`
}
