package provider

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// ErrNotFound reports that the provider has no instance with the given id.
var ErrNotFound = errors.New("instance not found at provider")

// State is what the provider observes about one instance.
type State string

// Observed states.
const (
	// StatePending: created but not yet running (e.g. booting).
	StatePending State = "pending"
	// StateRunning: the instance (or its agent process) is running.
	StateRunning State = "running"
	// StateStopped: the instance exists but its workload exited or is powered off.
	StateStopped State = "stopped"
)

// ArgImage is the reserved instance arg carrying a group's image
// (GroupSpec.image): it wins over the template's args, and a provider with
// images (aws) launches from it; the others only record it. Being an arg, a
// change makes the group's members drift and rotate.
const ArgImage = "image"

// ArgImageName is the instance arg (of a template or the defaults) naming
// one of the provider's looked-up images (aws: options.images). The
// server sets ArgImage to the id the name currently resolves to
// (imagelookup), so a newly resolved image makes the members drift and
// the group rolls it; an explicit ArgImage (GroupSpec.image) still wins.
const ArgImageName = "image_name"

// ImageResolver is implemented by providers that look images up by name.
type ImageResolver interface {
	// ImageNames returns the names of the provider's images, sorted.
	ImageNames() []string
	// ResolveImage looks the named image up now and returns its id. On a
	// failed lookup it returns the error; the caller keeps what it had.
	ResolveImage(ctx context.Context, name string) (string, error)
	// ImageFallback is the id to use when the first lookup of a name
	// fails ("" for none).
	ImageFallback(name string) string
	// ImageRefreshInterval is how long a resolved id is used before the
	// next lookup.
	ImageRefreshInterval() time.Duration
}

// CreateRequest carries everything a provider needs to start one instance.
type CreateRequest struct {
	InstanceID   string
	ProviderID   string
	Cluster      string
	Shard        string
	Tenant       string
	GroupID      string
	Template     string
	InstanceType string
	SubnetPool   string
	Vars         map[string]string
	Args         map[string]string
	Labels       map[string]string
	// AgentNonce is the short-lived registration nonce JWT for the agent.
	AgentNonce string
	// CACertPEM is the cluster CA certificate the agent trusts.
	CACertPEM []byte
	// RegistrationAddr and AgentAddr are the server endpoints the agent dials.
	RegistrationAddr string
	AgentAddr        string
	// UserData is the instance's own bootstrap data (the tenant's, or the
	// template's userdata rendered for it), empty when it has none. A
	// provider delivers it beside the agent's bootstrap, never instead of
	// it; UserDataFormat is "cloud-config" or "ignition".
	UserData       []byte
	UserDataFormat string
}

// Instance is the provider's view of one instance.
type Instance struct {
	InstanceID string
	ProviderID string
	State      State
	// Message is a human-readable detail, e.g. why the workload stopped.
	Message   string
	Addresses []string
}

// Provider is an infrastructure backend. Implementations are safe for
// concurrent use. Create is idempotent per instance id: creating an id that
// already exists returns the existing instance. Delete of a missing instance
// is not an error.
type Provider interface {
	Create(ctx context.Context, req CreateRequest) (Instance, error)
	// Status returns ErrNotFound (wrapped) when the instance does not exist.
	Status(ctx context.Context, instanceID string) (Instance, error)
	List(ctx context.Context) ([]Instance, error)
	Delete(ctx context.Context, instanceID string) error
}

// ID returns the provider id the local providers use:
// nstance://{cluster}/{shard}/{instanceID}.
func ID(cluster, shard, instanceID string) string {
	return fmt.Sprintf("nstance://%s/%s/%s", cluster, shard, instanceID)
}

var instanceIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateInstanceID checks that id is a DNS label (lowercase letters, digits
// and '-', at most 63 characters), usable as a tmux window, file and Node name.
func ValidateInstanceID(id string) error {
	if !instanceIDPattern.MatchString(id) {
		return fmt.Errorf("invalid instance id %q: want a DNS label of at most 63 lowercase letters, digits and '-'", id)
	}
	return nil
}
