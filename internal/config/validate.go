package config

import (
	"fmt"
	"net"
	"net/netip"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
)

// Default values applied by ApplyDefaults.
const (
	DefaultLeaseDuration    = 15 * time.Second
	DefaultRenewFraction    = 3
	DefaultRetryInterval    = 2 * time.Second
	DefaultMaxClockSkew     = time.Second
	DefaultCAValidity       = 10 * 365 * 24 * time.Hour
	DefaultServerValidity   = 90 * 24 * time.Hour
	DefaultAgentValidity    = 30 * 24 * time.Hour
	DefaultOperatorValidity = 90 * 24 * time.Hour
	DefaultAgentNonceTTL    = 15 * time.Minute
	// DefaultNonceMaxLifetime bounds every registration nonce (exp - iat);
	// operator nonces are minted for 3h by default and 24h at most is common.
	DefaultNonceMaxLifetime = 24 * time.Hour
	// MaxNonceMaxLifetime is the longest certificates.nonce_max_lifetime
	// a config may set. Nonce markers written by versions that recorded no
	// expiry are kept this long (plus allowances) after they were written.
	MaxNonceMaxLifetime = 30 * 24 * time.Hour
	// DefaultRevocationSyncInterval is how often revocations are re-read.
	DefaultRevocationSyncInterval = 10 * time.Second
	DefaultStorageTimeout         = 10 * time.Second
	DefaultShutdownTimeout        = 10 * time.Second
	DefaultEncryptionKeyEnv       = "NSTANCE_ENCRYPTION_KEY"
)

// ApplyDefaults fills every unset timing and key source with its default.
func (c *Config) ApplyDefaults() {
	le := &c.Cluster.LeaderElection
	if le.LeaseDuration == 0 {
		le.LeaseDuration = Duration(DefaultLeaseDuration)
	}
	if le.RenewInterval == 0 {
		le.RenewInterval = Duration(le.LeaseDuration.D() / DefaultRenewFraction)
	}
	if le.RetryInterval == 0 {
		le.RetryInterval = Duration(min(DefaultRetryInterval, le.RenewInterval.D()))
	}
	if le.RenewDeadline == 0 {
		le.RenewDeadline = Duration(DefaultRenewDeadline(le.LeaseDuration.D(), le.RenewInterval.D()))
	}
	if le.MaxClockSkew == 0 {
		le.MaxClockSkew = Duration(DefaultMaxClockSkew)
	}
	ek := &c.Cluster.Secrets.EncryptionKey
	if ek.Provider == "" {
		ek.Provider = "env"
	}
	if ek.Provider == "env" && ek.Env == "" {
		ek.Env = DefaultEncryptionKeyEnv
	}
	for i := range c.Cluster.Secrets.PreviousKeys {
		pk := &c.Cluster.Secrets.PreviousKeys[i]
		if pk.Provider == "" {
			pk.Provider = "env"
		}
	}
	ce := &c.Certificates
	setDur(&ce.CAValidity, DefaultCAValidity)
	setDur(&ce.ServerValidity, DefaultServerValidity)
	setDur(&ce.AgentValidity, DefaultAgentValidity)
	setDur(&ce.OperatorValidity, DefaultOperatorValidity)
	setDur(&ce.AgentNonceTTL, DefaultAgentNonceTTL)
	setDur(&ce.NonceMaxLifetime, DefaultNonceMaxLifetime)
	setDur(&ce.RevocationSyncInterval, DefaultRevocationSyncInterval)
	setDur(&c.Shard.Timeouts.StorageCall, DefaultStorageTimeout)
	setDur(&c.Shard.Timeouts.Shutdown, DefaultShutdownTimeout)
	c.Shard.GarbageCollection = c.Shard.GarbageCollection.WithDefaults()
	c.Shard.Limits.applyDefaults()
	c.Shard.FileSources.applyDefaults()
	la := &c.Shard.LeaderAddress
	if la.Mode == "" {
		la.Mode = LeaderAddressNone
	}
	if la.Mode == LeaderAddressAWSENI && la.DeviceIndex == 0 {
		la.DeviceIndex = 1
	}
}

func setDur(d *Duration, v time.Duration) {
	if *d == 0 {
		*d = Duration(v)
	}
}

type checker struct{ errs Errors }

func (c *checker) add(key, format string, args ...any) {
	c.errs = append(c.errs, FieldError{Key: key, Reason: fmt.Sprintf(format, args...)})
}

func (c *checker) id(key, what, v string, required bool) {
	if v == "" {
		if required {
			c.add(key, "required")
		}
		return
	}
	if err := layout.ValidateID(what, v); err != nil {
		c.add(key, "%v", err)
	}
}

func (c *checker) addr(key, v string) {
	if v == "" {
		c.add(key, "required")
		return
	}
	if err := CheckAddr(v); err != nil {
		c.add(key, "invalid address %q: %v", v, err)
	}
}

func (c *checker) positive(key string, d Duration) {
	if d < 0 {
		c.add(key, "must not be negative, got %s", d.D())
	}
}

// CheckAddr accepts host:port with a numeric port 0-65535.
func CheckAddr(v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number between 0 and 65535", port)
	}
	return nil
}

var (
	fileKinds = map[string]bool{"certificate": true, "ca_bundle": true, "secret": true, "storage": true, "env": true, "json": true, "string": true}
	keyTypes  = map[string]bool{"ed25519": true, "ecdsa-p256": true, "ecdsa-p384": true, "rsa-2048": true, "rsa-4096": true}
	usages    = map[string]bool{"server_auth": true, "client_auth": true}
)

// Validate checks every value and returns Errors naming each bad key.
func (c *Config) Validate() error {
	var ch checker
	ch.id("cluster.id", "cluster id", c.Cluster.ID, true)
	switch c.Cluster.Storage.Kind {
	case "", "s3", "gcs", "file":
	default:
		ch.add("cluster.storage.kind", "must be \"s3\", \"gcs\" or \"file\", got %q", c.Cluster.Storage.Kind)
	}
	checkKeySource(&ch, "cluster.secrets.encryption_key", c.Cluster.Secrets.EncryptionKey)
	for i, ks := range c.Cluster.Secrets.PreviousKeys {
		checkKeySource(&ch, fmt.Sprintf("cluster.secrets.previous_keys[%d]", i), ks)
	}
	le := c.Cluster.LeaderElection
	ch.positive("cluster.leader_election.lease_duration", le.LeaseDuration)
	ch.positive("cluster.leader_election.renew_interval", le.RenewInterval)
	ch.positive("cluster.leader_election.retry_interval", le.RetryInterval)
	if le.RenewInterval >= le.LeaseDuration {
		ch.add("cluster.leader_election.renew_interval", "must be shorter than lease_duration (%s), got %s", le.LeaseDuration.D(), le.RenewInterval.D())
	}
	if le.RenewDeadline != 0 && (le.RenewDeadline <= le.RenewInterval || le.RenewDeadline >= le.LeaseDuration) {
		ch.add("cluster.leader_election.renew_deadline", "must be longer than renew_interval (%s) and shorter than lease_duration (%s), got %s",
			le.RenewInterval.D(), le.LeaseDuration.D(), le.RenewDeadline.D())
	}
	if le.MaxClockSkew < 0 {
		ch.add("cluster.leader_election.max_clock_skew", "must not be negative, got %s", le.MaxClockSkew.D())
	}

	s := c.Shard
	ch.id("shard.id", "shard id", s.ID, true)
	if s.Infra.Provider == "" {
		ch.add("shard.infra.provider", "required")
	} else {
		ch.id("shard.infra.provider", "provider", s.Infra.Provider, true)
	}
	b := s.Bind
	ch.addr("shard.bind.health_addr", b.HealthAddr)
	ch.addr("shard.bind.election_addr", b.ElectionAddr)
	ch.addr("shard.bind.registration_addr", b.RegistrationAddr)
	ch.addr("shard.bind.operator_addr", b.OperatorAddr)
	ch.addr("shard.bind.agent_addr", b.AgentAddr)
	seen := map[string]string{}
	for _, kv := range [][2]string{
		{"shard.bind.health_addr", b.HealthAddr}, {"shard.bind.election_addr", b.ElectionAddr},
		{"shard.bind.registration_addr", b.RegistrationAddr}, {"shard.bind.operator_addr", b.OperatorAddr},
		{"shard.bind.agent_addr", b.AgentAddr},
	} {
		if _, port, err := net.SplitHostPort(kv[1]); err == nil && port != "0" {
			if other, dup := seen[kv[1]]; dup {
				ch.add(kv[0], "address %q is already used by %s", kv[1], other)
			}
			seen[kv[1]] = kv[0]
		}
	}
	for i, h := range s.Advertise.Hosts {
		if h == "" || strings.ContainsAny(h, " /:") && net.ParseIP(h) == nil {
			ch.add(fmt.Sprintf("shard.advertise.hosts[%d]", i), "invalid host %q", h)
		}
	}
	for _, kv := range [][2]string{
		{"shard.advertise.registration_addr", s.Advertise.RegistrationAddr},
		{"shard.advertise.agent_addr", s.Advertise.AgentAddr},
		{"shard.advertise.operator_addr", s.Advertise.OperatorAddr},
	} {
		if kv[1] != "" {
			ch.addr(kv[0], kv[1])
		}
	}
	ch.positive("shard.health_check_interval", s.HealthCheckInterval)
	ch.positive("shard.agent_startup_grace", s.AgentStartupGrace)
	ch.positive("shard.agent_reconnect_grace", s.AgentReconnectGrace)
	ch.positive("shard.shutdown_grace", s.ShutdownGrace)
	for _, n := range []struct {
		key string
		v   int
	}{{"shard.health_misses", s.HealthMisses}, {"shard.rotation_surge", s.RotationSurge}} {
		if n.v < 0 {
			ch.add(n.key, "must not be negative, got %d", n.v)
		}
	}
	ch.positive("shard.default_drain_timeout", s.DefaultDrainTimeout)
	if s.CreateRateLimit.PerMinute < 0 {
		ch.add("shard.create_rate_limit.per_minute", "must not be negative")
	}
	if s.CreateRateLimit.Burst < 0 {
		ch.add("shard.create_rate_limit.burst", "must not be negative")
	}
	for name, pool := range s.SubnetPools {
		key := "shard.subnet_pools." + name
		ch.id(key, "subnet pool name", name, true)
		if len(pool.Subnets) == 0 {
			ch.add(key+".subnets", "must list at least one subnet")
		}
	}
	for name, pool := range s.DynamicSubnetPools {
		key := "shard.dynamic_subnet_pools." + name
		ch.id(key, "subnet pool name", name, true)
		if _, ok := s.SubnetPools[name]; ok {
			ch.add(key, "also defined in shard.subnet_pools")
		}
		if len(pool.Tags) == 0 {
			ch.add(key+".tags", "must name at least one tag")
		}
		for k := range pool.Tags {
			if k == "" {
				ch.add(key+".tags", "empty tag key")
			}
		}
	}
	switch s.Registration.SourceAddressCheck {
	case "", "enforce", "off":
	default:
		ch.add("shard.registration.source_address_check", `must be "enforce" or "off", got %q`, s.Registration.SourceAddressCheck)
	}
	for i, p := range s.Registration.TrustedProxies {
		if _, err := parsePrefix(p); err != nil {
			ch.add(fmt.Sprintf("shard.registration.trusted_proxies[%d]", i), "%v", err)
		}
	}
	ex := s.Expiry
	ch.positive("shard.expiry.eligible_age", ex.EligibleAge)
	ch.positive("shard.expiry.forced_age", ex.ForcedAge)
	ch.positive("shard.expiry.ondemand_age", ex.OndemandAge)
	if ex.ForcedAge > 0 && ex.EligibleAge > ex.ForcedAge {
		ch.add("shard.expiry.forced_age", "must not be shorter than eligible_age (%s)", ex.EligibleAge.D())
	}
	ch.positive("shard.garbage_collection.interval", s.GarbageCollection.Interval)
	ch.positive("shard.garbage_collection.grace_period", s.GarbageCollection.GracePeriod)
	s.Limits.validate(&ch)
	s.FileSources.validate(&ch)
	checkLeaderAddress(&ch, s.LeaderAddress)

	ce := c.Certificates
	for _, kv := range []struct {
		key string
		d   Duration
	}{
		{"certificates.ca_validity", ce.CAValidity}, {"certificates.server_validity", ce.ServerValidity},
		{"certificates.agent_validity", ce.AgentValidity}, {"certificates.operator_validity", ce.OperatorValidity},
		{"certificates.agent_nonce_ttl", ce.AgentNonceTTL}, {"certificates.nonce_max_lifetime", ce.NonceMaxLifetime},
		{"certificates.revocation_sync_interval", ce.RevocationSyncInterval},
	} {
		if kv.d <= 0 {
			ch.add(kv.key, "must be positive")
		}
	}
	if ce.NonceMaxLifetime.D() > MaxNonceMaxLifetime {
		ch.add("certificates.nonce_max_lifetime", "must be at most %s, got %s", MaxNonceMaxLifetime, ce.NonceMaxLifetime.D())
	}
	if ce.NonceMaxLifetime > 0 && ce.AgentNonceTTL > ce.NonceMaxLifetime {
		ch.add("certificates.agent_nonce_ttl", "must not be longer than certificates.nonce_max_lifetime (%s), got %s", ce.NonceMaxLifetime.D(), ce.AgentNonceTTL.D())
	}

	if d := s.InstanceDomain; d != "" {
		if err := checkDomain(d); err != nil {
			ch.add("shard.instance_domain", "%v", err)
		}
	}
	for name, t := range c.Templates {
		checkTemplate(&ch, "templates."+name, name, t, &s)
		checkUserdata(&ch, "templates."+name, t, s.Limits.MaxUserDataBytes)
		checkFileBytes(&ch, "templates."+name, t, s.Limits.MaxFileBytes)
	}
	for tenant, groups := range c.Groups {
		ch.id("groups."+tenant, "tenant", tenant, true)
		for gname, g := range groups {
			key := "groups." + tenant + "." + gname
			ch.id(key, "group name", gname, true)
			if g.Template == "" {
				ch.add(key+".template", "required")
			} else if _, ok := c.Templates[g.Template]; !ok {
				ch.add(key+".template", "unknown template %q", g.Template)
			}
			if g.Size < 0 {
				ch.add(key+".size", "must not be negative, got %d", g.Size)
			}
			if g.SubnetPool != "" && !s.HasSubnetPool(g.SubnetPool) {
				ch.add(key+".subnet_pool", "unknown subnet pool %q", g.SubnetPool)
			}
			if g.DrainTimeout != nil {
				ch.positive(key+".drain_timeout", *g.DrainTimeout)
			}
		}
	}
	checkInstanceTypes(&ch, c.InstanceTypes)
	c.checkLoadBalancers(&ch)
	c.checkTenancy(&ch)
	c.checkWorkloadNames(&ch)
	c.checkImportedCertificates(&ch)
	if len(ch.errs) > 0 {
		sortErrors(ch.errs)
		return ch.errs
	}
	return nil
}

// IsDevProvider reports whether provider runs instances on this machine for
// development (tmux, process, mock); the server relaxes some production
// warnings for them.
func IsDevProvider(provider string) bool {
	switch provider {
	case "tmux", "process", "mock":
		return true
	}
	return false
}

func checkKeySource(ch *checker, key string, ks KeySource) {
	switch ks.Provider {
	case "env":
		if ks.Env == "" {
			ch.add(key+".env", "required for provider env")
		}
	case "file":
		if ks.File == "" {
			ch.add(key+".file", "required for provider file")
		}
	case "aws-secrets-manager":
		if ks.SecretID == "" {
			ch.add(key+".secret_id", "required for provider aws-secrets-manager")
		}
		if ks.VersionStage != "" && ks.VersionID != "" {
			ch.add(key+".version_id", "set only one of version_stage and version_id")
		}
	case "aws-ssm":
		if ks.Parameter == "" {
			ch.add(key+".parameter", "required for provider aws-ssm")
		}
	case FileSourceGCPSecretManager:
		checkGCPSecret(ch, key, ks.SecretID, ks.VersionStage)
	default:
		ch.add(key+".provider", "must be \"env\", \"file\", \"aws-secrets-manager\", \"aws-ssm\" or \"gcp-secret-manager\", got %q", ks.Provider)
	}
	if ks.Provider != "aws-secrets-manager" && ks.Provider != FileSourceGCPSecretManager && (ks.SecretID != "" || ks.VersionStage != "" || ks.VersionID != "") {
		ch.add(key+".secret_id", "secret_id, version_stage and version_id are for providers aws-secrets-manager and gcp-secret-manager")
	}
	if ks.Provider != "aws-ssm" && ks.Parameter != "" {
		ch.add(key+".parameter", "for provider aws-ssm only")
	}
	if ks.Region != "" && ks.Provider != "aws-secrets-manager" && ks.Provider != "aws-ssm" {
		ch.add(key+".region", "for the AWS providers only")
	}
}

// checkGCPSecret checks the secret_id of a gcp-secret-manager source (the
// version goes in version_id; Secret Manager has no stages).
func checkGCPSecret(ch *checker, key, secretID, stage string) {
	switch {
	case secretID == "":
		ch.add(key+".secret_id", "required for gcp-secret-manager (projects/PROJECT/secrets/NAME)")
	case !secrets.ValidGCPSecretID(secretID):
		ch.add(key+".secret_id", "must be projects/PROJECT/secrets/NAME for gcp-secret-manager (the version goes in version_id), got %q", secretID)
	}
	if stage != "" {
		ch.add(key+".version_stage", "not for gcp-secret-manager (use version_id: a number or latest)")
	}
}

func checkLeaderAddress(ch *checker, la LeaderAddress) {
	const key = "shard.leader_address"
	switch la.Mode {
	case "", LeaderAddressNone:
		for _, kv := range [][2]string{{"interface", la.Interface}, {"address", la.Address}, {"network_interface_id", la.NetworkInterfaceID}, {"gcp_address", la.GCPAddress}} {
			if kv[1] != "" {
				ch.add(key+"."+kv[0], "set, but mode is none (want mode vip, aws-eni or gcp-alias-ip)")
			}
		}
	case LeaderAddressVIP:
		if la.Interface == "" {
			ch.add(key+".interface", "required for mode vip")
		} else if len(la.Interface) > 15 || strings.ContainsAny(la.Interface, "/ \t") {
			ch.add(key+".interface", "invalid interface name %q", la.Interface)
		}
		if la.Address == "" {
			ch.add(key+".address", "required for mode vip (an IPv4 address with its prefix length, e.g. 10.0.0.10/24)")
		} else if p, err := netip.ParsePrefix(la.Address); err != nil {
			ch.add(key+".address", "want an IPv4 address with its prefix length, e.g. 10.0.0.10/24: %v", err)
		} else if !p.Addr().Is4() {
			ch.add(key+".address", "mode vip supports IPv4 addresses only, got %q", la.Address)
		} else if a := p.Addr(); a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || p.Bits() == 0 {
			ch.add(key+".address", "%q is not a unicast host address with a prefix", la.Address)
		}
		if la.NetworkInterfaceID != "" {
			ch.add(key+".network_interface_id", "set, but mode is vip")
		}
	case LeaderAddressAWSENI:
		if la.NetworkInterfaceID == "" {
			ch.add(key+".network_interface_id", "required for mode aws-eni")
		} else if !eniID.MatchString(la.NetworkInterfaceID) {
			ch.add(key+".network_interface_id", "want an ENI id such as eni-0123456789abcdef0, got %q", la.NetworkInterfaceID)
		}
		if la.DeviceIndex < 0 {
			ch.add(key+".device_index", "must not be negative, got %d", la.DeviceIndex)
		}
		if la.Interface != "" || la.Address != "" {
			ch.add(key, "interface and address are for mode vip, not aws-eni")
		}
	case LeaderAddressGCPAlias:
		if la.GCPAddress == "" {
			ch.add(key+".gcp_address", "required for mode gcp-alias-ip (a reserved internal address: its name or projects/P/regions/R/addresses/NAME)")
		} else if !gcpAddress.MatchString(la.GCPAddress) {
			ch.add(key+".gcp_address", "want an address name or projects/P/regions/R/addresses/NAME, got %q", la.GCPAddress)
		}
		if la.Interface != "" || la.Address != "" || la.NetworkInterfaceID != "" {
			ch.add(key, "interface, address and network_interface_id are for modes vip and aws-eni, not gcp-alias-ip")
		}
	default:
		ch.add(key+".mode", `must be "none", "vip", "aws-eni" or "gcp-alias-ip", got %q`, la.Mode)
	}
	if la.GCPAddress != "" && (la.Mode == LeaderAddressVIP || la.Mode == LeaderAddressAWSENI) {
		ch.add(key+".gcp_address", "set, but mode is %s (want mode gcp-alias-ip)", la.Mode)
	}
}

var gcpAddress = regexp.MustCompile(`^(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/regions/[a-z0-9-]+/addresses/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

var eniID = regexp.MustCompile(`^eni-[0-9a-f]{8}([0-9a-f]{9})?$`)

// ValidENIID reports whether id has the form of an EC2 network interface id.
func ValidENIID(id string) bool { return eniID.MatchString(id) }

func checkTemplate(ch *checker, key, name string, t Template, s *Shard) {
	ch.id(key, "template name", name, true)
	if t.Size < 0 {
		ch.add(key+".size", "must not be negative, got %d", t.Size)
	}
	if t.SubnetPool != "" && !s.HasSubnetPool(t.SubnetPool) {
		ch.add(key+".subnet_pool", "unknown subnet pool %q", t.SubnetPool)
	}
	for kname, k := range t.Keys {
		kk := key + ".keys." + kname
		ch.id(kk, "key name", kname, true)
		if kname == pki.AgentIdentityKeyName {
			ch.add(kk, "the key name %q is reserved for the agent's own identity renewal", kname)
		}
		if !keyTypes[k.Type] {
			ch.add(kk+".type", "must be one of ed25519, ecdsa-p256, ecdsa-p384, rsa-2048, rsa-4096, got %q", k.Type)
		}
		if k.Certificate != nil {
			if len(k.Certificate.Usages) == 0 {
				ch.add(kk+".certificate.usages", "required: list server_auth and/or client_auth (a workload certificate's purposes are always explicit)")
			}
			for i, u := range k.Certificate.Usages {
				if !usages[u] {
					ch.add(fmt.Sprintf("%s.certificate.usages[%d]", kk, i), "must be server_auth or client_auth, got %q", u)
				}
			}
			for i, ip := range k.Certificate.IPAddresses {
				if net.ParseIP(ip) == nil && !strings.Contains(ip, "{{") {
					ch.add(fmt.Sprintf("%s.certificate.ip_addresses[%d]", kk, i), "invalid IP address %q", ip)
				}
			}
			ch.positive(kk+".certificate.validity", k.Certificate.Validity)
		}
	}
	for fname, f := range t.Files {
		fk := key + ".files." + fname
		if !fileKinds[f.Kind] {
			ch.add(fk+".kind", "must be one of certificate, ca_bundle, secret, storage, env, json, string, got %q", f.Kind)
		}
		p := f.Path
		if p == "" {
			p = fname
		}
		if path.IsAbs(p) || p != path.Clean(p) || p == ".." || strings.HasPrefix(p, "../") {
			ch.add(fk+".path", "must be a clean relative path without \"..\", got %q", p)
		}
		if f.Mode != "" {
			if m, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || m > 0o777 {
				ch.add(fk+".mode", "must be an octal permission such as \"0600\", got %q", f.Mode)
			}
		}
		if f.Kind == "certificate" {
			if f.Key == "" {
				ch.add(fk+".key", "required for kind certificate")
			} else if _, ok := t.Keys[f.Key]; !ok {
				ch.add(fk+".key", "unknown key %q", f.Key)
			}
		}
		checkFileSource(ch, fk, f)
	}
}

// checkFileBytes refuses a template whose literal file contents alone exceed
// the per-instance delivery limit (rendered vars are checked again when the
// files are built for an instance).
func checkFileBytes(ch *checker, key string, t Template, limit int) {
	if limit <= 0 {
		return
	}
	total := 0
	for _, f := range t.Files {
		total += len(f.Content)
	}
	if total > limit {
		ch.add(key+".files", "file contents total %d bytes, more than shard.limits.max_file_bytes (%d); raise the limit (with max_message_bytes) or ship the content another way", total, limit)
	}
}

// ApplyPortOffset adds offset to the port of every bind address (the dev stack
// runs server N with offset 10*(N-1)). A port of 0 stays 0.
func (b *Bind) ApplyPortOffset(offset int) error {
	if offset == 0 {
		return nil
	}
	for _, p := range []*string{&b.HealthAddr, &b.ElectionAddr, &b.RegistrationAddr, &b.OperatorAddr, &b.AgentAddr} {
		host, port, err := net.SplitHostPort(*p)
		if err != nil {
			return fmt.Errorf("applying port offset to %q: %w", *p, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("applying port offset to %q: port is not a number", *p)
		}
		if n == 0 {
			continue
		}
		if n+offset <= 0 || n+offset > 65535 {
			return fmt.Errorf("applying port offset %d to %q: port out of range", offset, *p)
		}
		*p = net.JoinHostPort(host, strconv.Itoa(n+offset))
	}
	return nil
}

// DefaultRenewDeadline is two thirds of the lease, or halfway between the
// renew interval and the lease when the interval is longer than that.
func DefaultRenewDeadline(lease, renew time.Duration) time.Duration {
	d := lease * 2 / 3
	if d <= renew {
		d = renew + (lease-renew)/2
	}
	return d
}
