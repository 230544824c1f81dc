package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// DefaultPath is where the operator looks for its configuration file.
const DefaultPath = "/etc/nstance/operator/config.yaml"

// Shard holds the two gRPC endpoints of one shard's nstance-server.
type Shard struct {
	// RegistrationAddr (host:port) serves the anonymous-TLS registration API.
	RegistrationAddr string `json:"registration_addr"`
	// OperatorAddr (host:port) serves the mTLS operator API.
	OperatorAddr string `json:"operator_addr"`
}

// Config is the operator configuration file.
type Config struct {
	// ClusterID identifies the Nstance cluster.
	ClusterID string `json:"cluster_id"`
	// Tenant the operator acts for.
	Tenant string `json:"tenant"`
	// Shards maps shard IDs to their endpoints.
	Shards map[string]Shard `json:"shards"`
	// OnDemandNamespaces are the namespaces (of the workload cluster) whose
	// pods may ask for on-demand instances (on-demand.nstance.dev/group);
	// pods elsewhere are refused with a Warning Event. Empty: only the
	// operator's own namespace (NSTANCE_NAMESPACE).
	OnDemandNamespaces []string `json:"on_demand_namespaces,omitempty"`
	// CarryLabelPrefixes and CarryTaintPrefixes: labels and taints of a
	// pool's Node whose key starts with one of them are given to the Node
	// of the instance that replaces it (package nodecarry). Empty (the
	// default): nothing is carried. Keys Kubernetes or Cluster API own
	// (ReservedNodeKey) are never carried, whatever the prefix.
	CarryLabelPrefixes []string `json:"carry_label_prefixes,omitempty"`
	CarryTaintPrefixes []string `json:"carry_taint_prefixes,omitempty"`
}

// ReservedNodeKey reports whether a label or taint key belongs to
// Kubernetes (kubernetes.io, k8s.io and their subdomains) or to Cluster API
// (node.cluster.x-k8s.io and its subdomains, which core CAPI syncs from the
// Machine): the operator never copies such a key from one Node to another.
func ReservedNodeKey(key string) bool {
	domain, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	for _, d := range []string{"kubernetes.io", "k8s.io", "node.cluster.x-k8s.io"} {
		if domain == d || strings.HasSuffix(domain, "."+d) {
			return true
		}
	}
	return false
}

// dnsLabel is the shape of cluster, tenant and shard identifiers: the same
// pattern the NstanceShardGroup CRD accepts for spec.shard.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("operator config file %s does not exist (set --config)", path)
		}
		return nil, fmt.Errorf("read operator config %s: %w", path, err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("operator config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes and validates configuration YAML. Unknown keys are errors,
// so a misspelt field does not go unnoticed.
func Parse(data []byte) (*Config, error) {
	var cfg Config
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return nil, fmt.Errorf("parse YAML: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.ClusterID == "" {
		errs = append(errs, errors.New("cluster_id is required"))
	} else if !dnsLabel.MatchString(c.ClusterID) || len(c.ClusterID) > 63 {
		errs = append(errs, fmt.Errorf("cluster_id %q must be a DNS label (lower-case letters, digits, '-')", c.ClusterID))
	}
	if c.Tenant == "" {
		errs = append(errs, errors.New("tenant is required"))
	} else if !dnsLabel.MatchString(c.Tenant) || len(c.Tenant) > 63 {
		errs = append(errs, fmt.Errorf("tenant %q must be a DNS label", c.Tenant))
	}
	if len(c.Shards) == 0 {
		errs = append(errs, errors.New("shards: at least one shard is required"))
	}
	for _, id := range c.ShardIDs() {
		s := c.Shards[id]
		if !dnsLabel.MatchString(id) || len(id) > 63 || strings.Contains(id, "--") {
			errs = append(errs, fmt.Errorf("shards.%s: shard ID must be a DNS label without \"--\"", id))
		}
		for _, f := range []struct{ name, addr string }{
			{"registration_addr", s.RegistrationAddr},
			{"operator_addr", s.OperatorAddr},
		} {
			if f.addr == "" {
				errs = append(errs, fmt.Errorf("shards.%s.%s is required", id, f.name))
				continue
			}
			host, port, err := net.SplitHostPort(f.addr)
			if err != nil || host == "" || port == "" {
				errs = append(errs, fmt.Errorf("shards.%s.%s %q must be host:port", id, f.name, f.addr))
			}
		}
	}
	for i, ns := range c.OnDemandNamespaces {
		if !dnsLabel.MatchString(ns) || len(ns) > 63 {
			errs = append(errs, fmt.Errorf("on_demand_namespaces[%d] %q must be a namespace name (a DNS label)", i, ns))
		}
	}
	for _, f := range []struct {
		name     string
		prefixes []string
	}{{"carry_label_prefixes", c.CarryLabelPrefixes}, {"carry_taint_prefixes", c.CarryTaintPrefixes}} {
		for i, p := range f.prefixes {
			switch {
			case strings.TrimSpace(p) == "":
				errs = append(errs, fmt.Errorf("%s[%d] is empty (it would carry every key)", f.name, i))
			case strings.Contains(p, "/") && ReservedNodeKey(p):
				errs = append(errs, fmt.Errorf("%s[%d] %q names keys Kubernetes or Cluster API own (kubernetes.io, k8s.io, node.cluster.x-k8s.io), which are never carried", f.name, i, p))
			}
		}
	}
	return errors.Join(errs...)
}

// ShardIDs returns the configured shard IDs in lexical order, the order the
// operator tries shards in (registration, import).
func (c *Config) ShardIDs() []string {
	ids := make([]string, 0, len(c.Shards))
	for id := range c.Shards {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
