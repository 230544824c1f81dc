package proxmox

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// KindName selects this provider in shard.infra.provider.
const KindName = "proxmox"

// EnvTokenSecret carries the API token's secret when token_secret_file is
// not set.
const EnvTokenSecret = "NSTANCE_PROXMOX_TOKEN_SECRET"

// Defaults of Options.
const (
	DefaultCloudInitStorage = "local"
	DefaultCloudInitDevice  = "ide3"
	DefaultTaskTimeout      = 10 * time.Minute
	DefaultRequestTimeout   = 30 * time.Second
)

// Instance args (template or defaults args) that override Options per
// instance.
const (
	// ArgTemplateVMID is the template VM to clone (a VMID). The image arg
	// (GroupSpec.image) means the same when it is a number.
	ArgTemplateVMID = "proxmox.template_vmid"
	// ArgPool is the resource pool of the VM.
	ArgPool = "proxmox.pool"
	// ArgStorage is where a full clone's disks go.
	ArgStorage = "proxmox.storage"
)

// Options is shard.infra.options of the proxmox kind.
type Options struct {
	// Endpoint is the API's base URL, e.g. https://pve1.example.com:8006/api2/json.
	Endpoint string `json:"endpoint"`
	// TokenID is the API token, user@realm!name (e.g. nstance@pve!server).
	TokenID string `json:"token_id"`
	// TokenSecretFile holds the token's secret (default: the
	// NSTANCE_PROXMOX_TOKEN_SECRET environment variable).
	TokenSecretFile string `json:"token_secret_file"`
	// CAFile is the CA bundle that signed the API's certificate (default:
	// the system's roots).
	CAFile string `json:"ca_file"`
	// InsecureSkipVerify accepts any API certificate (a lab only).
	InsecureSkipVerify bool `json:"insecure_skip_verify"`
	// Nodes are the cluster nodes instances are spread over (required).
	Nodes []string `json:"nodes"`
	// TemplateVMID is the template VM instances are cloned from (unless a
	// template's args name another); it may live on any node.
	TemplateVMID int `json:"template_vmid"`
	// NodeTemplates are per-node copies of the template (node → VMID): a
	// VM placed on such a node is cloned from its local copy, without
	// crossing nodes (templates on local storage).
	NodeTemplates map[string]int `json:"node_templates"`
	// FullClone copies the template's disks (default true); false makes
	// linked clones, which need the template to stay.
	FullClone bool `json:"full_clone"`
	// Storage is where a full clone's disks go (default: the template's).
	Storage string `json:"storage"`
	// Pool is the resource pool new VMs join (default: none).
	Pool string `json:"pool"`
	// CloudInitStorage is the storage (with content type ISO image, on
	// every node in Nodes) that receives each instance's cloud-init seed
	// ISO (default "local").
	CloudInitStorage string `json:"cloudinit_storage"`
	// CloudInitDevice is the CD-ROM slot the seed ISO is attached to
	// (default ide3; ide2 is often the template's installer drive).
	CloudInitDevice string `json:"cloudinit_device"`
	// NetworkConfig is cloud-init network configuration (version 1 or 2
	// YAML) put on every seed (default none: the image's own, DHCP on
	// most cloud images).
	NetworkConfig string `json:"network_config"`
	// Tags are added to every VM (ownership tags are added beside them).
	Tags []string `json:"tags"`
	// Agent places the agent's files on the machine.
	Agent cloudinit.Agent `json:"agent"`
	// TaskTimeout bounds each wait for a Proxmox task (clone, start, stop,
	// delete; default 10m: a full clone copies a disk).
	TaskTimeout config.Duration `json:"task_timeout"`
	// RequestTimeout bounds each API request (default 30s).
	RequestTimeout config.Duration `json:"request_timeout"`
}

// Kind registers the Proxmox VE provider.
func Kind() provider.Kind {
	return provider.Kind{Name: KindName, Config: func() provider.KindConfig { return DefaultOptions() }}
}

// DefaultOptions returns the options with every default set.
func DefaultOptions() *Options {
	return &Options{FullClone: true, CloudInitStorage: DefaultCloudInitStorage, CloudInitDevice: DefaultCloudInitDevice,
		Agent: cloudinit.DefaultAgent(), TaskTimeout: config.Duration(DefaultTaskTimeout), RequestTimeout: config.Duration(DefaultRequestTimeout)}
}

const optionsKey = "shard.infra.options"

var (
	tokenIDPattern = regexp.MustCompile(`^[^\s!@]+@[A-Za-z0-9.\-_]+![A-Za-z][A-Za-z0-9.\-_]*$`)
	// nodeNamePattern: Proxmox node names are host names.
	nodeNamePattern = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)
	storagePattern  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9\-_.]*$`)
	devicePattern   = regexp.MustCompile(`^(ide[0-3]|sata[0-5]|scsi([0-9]|[1-2][0-9]|30))$`)
)

// Validate implements provider.KindConfig.
func (o *Options) Validate(cfg *config.Config) config.Errors {
	var errs config.Errors
	add := func(key, format string, args ...any) {
		errs = append(errs, config.FieldError{Key: key, Reason: fmt.Sprintf(format, args...)})
	}
	if u, err := url.Parse(o.Endpoint); o.Endpoint == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		add(optionsKey+".endpoint", "want the API's base URL, e.g. https://pve1.example.com:8006/api2/json, got %q", o.Endpoint)
	}
	if !tokenIDPattern.MatchString(o.TokenID) {
		add(optionsKey+".token_id", "want an API token id user@realm!name, got %q", o.TokenID)
	}
	if len(o.Nodes) == 0 {
		add(optionsKey+".nodes", "required: the nodes instances are spread over")
	}
	seen := map[string]bool{}
	for i, n := range o.Nodes {
		if !nodeNamePattern.MatchString(n) {
			add(fmt.Sprintf("%s.nodes[%d]", optionsKey, i), "want a node name, got %q", n)
		}
		if seen[n] {
			add(fmt.Sprintf("%s.nodes[%d]", optionsKey, i), "node %q listed twice", n)
		}
		seen[n] = true
	}
	if o.TemplateVMID < 0 || o.TemplateVMID > 999999999 {
		add(optionsKey+".template_vmid", "want a VMID, got %d", o.TemplateVMID)
	}
	nodes := make([]string, 0, len(o.NodeTemplates))
	for n := range o.NodeTemplates {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		if !seen[n] {
			add(optionsKey+".node_templates."+n, "not one of nodes")
		}
		if v := o.NodeTemplates[n]; v < 100 {
			add(optionsKey+".node_templates."+n, "want a VMID (100 or more), got %d", v)
		}
	}
	for _, f := range []struct{ key, v string }{{"storage", o.Storage}, {"pool", o.Pool}} {
		if f.v != "" && !storagePattern.MatchString(f.v) {
			add(optionsKey+"."+f.key, "want a Proxmox id, got %q", f.v)
		}
	}
	if !storagePattern.MatchString(o.CloudInitStorage) {
		add(optionsKey+".cloudinit_storage", "want a storage id, got %q", o.CloudInitStorage)
	}
	if !devicePattern.MatchString(o.CloudInitDevice) {
		add(optionsKey+".cloudinit_device", "want a CD-ROM slot (ide0-3, sata0-5, scsi0-30), got %q", o.CloudInitDevice)
	}
	for i, t := range o.Tags {
		if !ValidTag(t) || strings.HasPrefix(t, TagPrefix) {
			add(fmt.Sprintf("%s.tags[%d]", optionsKey, i), "want a Proxmox tag (lower-case letters, digits, _ - + .) not starting with %s, got %q", TagPrefix, t)
		}
	}
	for k, reason := range o.Agent.Validate() {
		add(optionsKey+".agent."+k, "%s", reason)
	}
	if o.TaskTimeout <= 0 {
		add(optionsKey+".task_timeout", "must be positive, got %s", o.TaskTimeout.D())
	}
	if o.RequestTimeout <= 0 {
		add(optionsKey+".request_timeout", "must be positive, got %s", o.RequestTimeout.D())
	}
	for _, n := range cfg.TemplateNames() {
		args := cfg.TemplateArgs(n)
		if _, err := o.spec(args); err != nil {
			add("templates."+n+".args", "%v", err)
		}
	}
	sort.Slice(errs, func(a, b int) bool { return errs[a].Key < errs[b].Key })
	return errs
}

// spec is what one instance is cloned from, after args override the
// options.
type spec struct {
	templateVMID  int
	nodeTemplates map[string]int
	pool, storage string
}

func (o *Options) spec(args map[string]string) (spec, error) {
	s := spec{templateVMID: o.TemplateVMID, nodeTemplates: o.NodeTemplates, pool: o.Pool, storage: o.Storage}
	for _, a := range []string{ArgTemplateVMID, provider.ArgImage} {
		v := args[a]
		if v == "" {
			continue
		}
		id, err := strconv.Atoi(v)
		if err != nil || id < 100 {
			return s, fmt.Errorf("%s: want a template VMID (100 or more), got %q", a, v)
		}
		// A template named per instance is the one to clone on every
		// node.
		s.templateVMID, s.nodeTemplates = id, nil
	}
	if v := args[ArgPool]; v != "" {
		if !storagePattern.MatchString(v) {
			return s, fmt.Errorf("%s: want a pool id, got %q", ArgPool, v)
		}
		s.pool = v
	}
	if v := args[ArgStorage]; v != "" {
		if !storagePattern.MatchString(v) {
			return s, fmt.Errorf("%s: want a storage id, got %q", ArgStorage, v)
		}
		s.storage = v
	}
	if s.templateVMID == 0 && len(s.nodeTemplates) == 0 {
		return s, fmt.Errorf("no template: set %s.template_vmid or node_templates, or the %s arg", optionsKey, ArgTemplateVMID)
	}
	return s, nil
}

// template returns the VMID to clone for a VM placed on node.
func (s spec) template(node string) int {
	if v, ok := s.nodeTemplates[node]; ok {
		return v
	}
	return s.templateVMID
}

// New implements provider.KindConfig: an API client with the token.
func (o *Options) New(ctx context.Context, env provider.Env) (provider.Provider, error) {
	secret, err := o.tokenSecret()
	if err != nil {
		return nil, err
	}
	c, err := NewClient(*o, secret, nil)
	if err != nil {
		return nil, err
	}
	return New(c, *o, env), nil
}

func (o *Options) tokenSecret() (string, error) {
	if o.TokenSecretFile != "" {
		b, err := os.ReadFile(o.TokenSecretFile)
		if err != nil {
			return "", fmt.Errorf("reading the API token secret: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("the API token secret file %s is empty", o.TokenSecretFile)
		}
		return s, nil
	}
	if s := strings.TrimSpace(os.Getenv(EnvTokenSecret)); s != "" {
		return s, nil
	}
	return "", fmt.Errorf("no API token secret: set %s.token_secret_file or %s", optionsKey, EnvTokenSecret)
}
