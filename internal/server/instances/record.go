package instances

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// State is an instance's lifecycle position.
type State string

// Lifecycle states (see nstancev1.InstanceState).
const (
	StatePending         State = "pending"
	StateCreating        State = "creating"
	StateRunning         State = "running"
	StateUnhealthy       State = "unhealthy"
	StateStopped         State = "stopped"
	StatePendingDeletion State = "pending_deletion"
	StateDeleting        State = "deleting"
	// StateDeleted is never stored: records are removed once the provider
	// instance is gone. It describes a record returned after the fact.
	StateDeleted State = "deleted"
)

// Active reports whether the instance counts towards its group's size.
func (s State) Active() bool {
	switch s {
	case StatePending, StateCreating, StateRunning, StateUnhealthy, StateStopped:
		return true
	}
	return false
}

// Proto converts the state to its wire enum.
func (s State) Proto() nstancev1.InstanceState {
	switch s {
	case StatePending:
		return nstancev1.InstanceState_INSTANCE_STATE_PENDING
	case StateCreating:
		return nstancev1.InstanceState_INSTANCE_STATE_CREATING
	case StateRunning:
		return nstancev1.InstanceState_INSTANCE_STATE_RUNNING
	case StateUnhealthy:
		return nstancev1.InstanceState_INSTANCE_STATE_UNHEALTHY
	case StateStopped:
		return nstancev1.InstanceState_INSTANCE_STATE_STOPPED
	case StatePendingDeletion:
		return nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION
	case StateDeleting:
		return nstancev1.InstanceState_INSTANCE_STATE_DELETING
	case StateDeleted:
		return nstancev1.InstanceState_INSTANCE_STATE_DELETED
	}
	return nstancev1.InstanceState_INSTANCE_STATE_UNSPECIFIED
}

// Record is the durable record of one instance.
type Record struct {
	ID         string `json:"id"`
	Tenant     string `json:"tenant"`
	GroupID    string `json:"group_id,omitempty"`
	Shard      string `json:"shard"`
	ProviderID string `json:"provider_id"`
	// OnDemand instances came from CreateInstance; they do not count towards
	// their group's size and are not removed by scale-down.
	OnDemand     bool              `json:"on_demand,omitempty"`
	ClientToken  string            `json:"client_token,omitempty"`
	State        State             `json:"state"`
	Message      string            `json:"message,omitempty"`
	Template     string            `json:"template"`
	InstanceType string            `json:"instance_type,omitempty"`
	SubnetPool   string            `json:"subnet_pool,omitempty"`
	Vars         map[string]string `json:"vars,omitempty"`
	Args         map[string]string `json:"args,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// DrainTimeout is the effective drain timeout fixed at creation.
	DrainTimeout time.Duration `json:"drain_timeout"`
	CreatedAt    time.Time     `json:"created_at"`
	UpdatedAt    time.Time     `json:"updated_at"`
	LastHealthAt *time.Time    `json:"last_health_at,omitempty"`
	// FirstHealthAt is when the first health report of its agent was
	// recorded (never changed afterwards).
	FirstHealthAt *time.Time `json:"first_health_at,omitempty"`
	// TerminationNotice is the kind of termination the platform announced
	// through the agent (e.g. "spot"); the instance is replaced first.
	TerminationNotice string `json:"termination_notice,omitempty"`
	// AgentVersion is the agent binary version of the last persisted
	// health report.
	AgentVersion string `json:"agent_version,omitempty"`
	// WorkloadGone is set once the provider reported the VM stopped, deleted
	// or failed; a drain of it has nothing to evict.
	WorkloadGone bool `json:"workload_gone,omitempty"`
	// Addresses are the instance's IP addresses as the provider reported
	// them; its agent certificate carries them and registration checks the
	// caller's source address against them.
	Addresses []string `json:"addresses,omitempty"`
	// Agent is set once the instance's agent registered: the key it
	// registered with. Another key is refused for this instance.
	Agent *AgentRegistration `json:"agent,omitempty"`
	// Deletion fields, set once the instance is chosen for removal.
	DeletionReason nstancev1.DeletionReason `json:"deletion_reason,omitempty"`
	DrainDeadline  *time.Time               `json:"drain_deadline,omitempty"`
	DrainAcked     bool                     `json:"drain_acked,omitempty"`
	// ScaleDownFirst marks a group member its caller wants gone when the
	// group next shrinks (DeleteInstance with on_scale_down): scale-down
	// takes it before any other member. With ScaleDownSkipDrain its removal,
	// for whatever reason, announces no drain.
	ScaleDownFirst     bool `json:"scale_down_first,omitempty"`
	ScaleDownSkipDrain bool `json:"scale_down_skip_drain,omitempty"`
	// UserDataSHA256 and UserDataFormat name the bootstrap data the tenant
	// sent for it (its group's or its own; "" means the template's
	// userdata). BootUserDataSHA256 is the hash of what the provider was
	// given, whatever its source.
	UserDataSHA256     string `json:"user_data_sha256,omitempty"`
	UserDataFormat     string `json:"user_data_format,omitempty"`
	BootUserDataSHA256 string `json:"boot_user_data_sha256,omitempty"`
	// Requested is what CreateInstance asked for (on-demand instances), so
	// that drift can be told later by resolving the request again.
	Requested *Requested `json:"requested,omitempty"`
	// LoadBalancers is the instance's registration at each load balancer
	// of its group, by load_balancers entry.
	LoadBalancers map[string]loadbalancer.TargetState `json:"load_balancers,omitempty"`
	// DrainHeld is set while a pending deletion waits for the instance's
	// deregistration from its load balancers (and their delays): its drain
	// is announced, and its drain deadline set, only afterwards.
	DrainHeld bool `json:"drain_held,omitempty"`
}

// Requested holds the settings a CreateInstance request named itself; empty
// fields took the group's or template's value.
type Requested struct {
	Template       string            `json:"template,omitempty"`
	InstanceType   string            `json:"instance_type,omitempty"`
	SubnetPool     string            `json:"subnet_pool,omitempty"`
	Image          string            `json:"image,omitempty"`
	Vars           map[string]string `json:"vars,omitempty"`
	UserDataSHA256 string            `json:"user_data_sha256,omitempty"`
	UserDataFormat string            `json:"user_data_format,omitempty"`
}

// AgentRegistration records the registration of an instance's agent.
type AgentRegistration struct {
	// KeySHA256 is the hex SHA-256 of the agent public key (PKIX DER).
	KeySHA256    string    `json:"key_sha256"`
	NonceID      string    `json:"nonce_id"`
	Serial       string    `json:"serial"`
	RegisteredAt time.Time `json:"registered_at"`
	RegisteredBy string    `json:"registered_by,omitempty"`
}

// Clone returns a deep copy.
func (r *Record) Clone() *Record {
	c := *r
	c.Vars, c.Args, c.Labels = maps.Clone(r.Vars), maps.Clone(r.Args), maps.Clone(r.Labels)
	c.Addresses = slices.Clone(r.Addresses)
	// Its times are replaced, never written through.
	c.LoadBalancers = maps.Clone(r.LoadBalancers)
	if r.Agent != nil {
		a := *r.Agent
		c.Agent = &a
	}
	if r.LastHealthAt != nil {
		t := *r.LastHealthAt
		c.LastHealthAt = &t
	}
	if r.FirstHealthAt != nil {
		t := *r.FirstHealthAt
		c.FirstHealthAt = &t
	}
	if r.DrainDeadline != nil {
		t := *r.DrainDeadline
		c.DrainDeadline = &t
	}
	if r.Requested != nil {
		q := *r.Requested
		q.Vars = maps.Clone(q.Vars)
		c.Requested = &q
	}
	return &c
}

// Proto converts the record to its wire form.
func (r *Record) Proto() *nstancev1.InstanceStatus {
	st := &nstancev1.InstanceStatus{
		InstanceId: r.ID, GroupId: r.GroupID, Shard: r.Shard, ProviderId: r.ProviderID,
		State: r.State.Proto(), CreatedAt: timestamppb.New(r.CreatedAt), InstanceType: r.InstanceType,
		Message: r.Message, Template: r.Template, ClientToken: r.ClientToken, WorkloadGone: r.WorkloadGone,
		AgentVersion: r.AgentVersion, UserDataSha256: r.BootUserDataSHA256,
		Addresses: []*nstancev1.InstanceAddress{{Type: nstancev1.AddressType_ADDRESS_TYPE_HOSTNAME, Address: r.ID}},
	}
	for _, a := range r.Addresses {
		// The provider-reported addresses, which agent certificates carry.
		typ := nstancev1.AddressType_ADDRESS_TYPE_INTERNAL_DNS
		if net.ParseIP(a) != nil {
			typ = nstancev1.AddressType_ADDRESS_TYPE_INTERNAL_IP
		}
		st.Addresses = append(st.Addresses, &nstancev1.InstanceAddress{Type: typ, Address: a})
	}
	if r.LastHealthAt != nil {
		st.LastHealthAt = timestamppb.New(*r.LastHealthAt)
	}
	if r.FirstHealthAt != nil {
		st.FirstHealthAt = timestamppb.New(*r.FirstHealthAt)
	}
	if r.DrainDeadline != nil && r.State == StatePendingDeletion && !r.DrainHeld {
		// A held drain's deadline starts only once it is announced.
		st.DrainDeadline = timestamppb.New(*r.DrainDeadline)
	}
	st.Replaced = r.Replaced()
	for _, name := range slices.Sorted(maps.Keys(r.LoadBalancers)) {
		st.LoadBalancers = append(st.LoadBalancers, LoadBalancerProto(name, r.LoadBalancers[name]))
	}
	return st
}

// LoadBalancerProto is the wire form of the instance's state at load
// balancer name.
func LoadBalancerProto(name string, s loadbalancer.TargetState) *nstancev1.LoadBalancerTarget {
	t := &nstancev1.LoadBalancerTarget{Name: name, State: nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_PENDING}
	if s.Registered != nil {
		t.RegisteredAt = timestamppb.New(*s.Registered)
		t.State = nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_REGISTERED
	}
	if s.Deregistered != nil {
		t.DeregisteredAt = timestamppb.New(*s.Deregistered)
		t.State = nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_DEREGISTERING
	}
	if s.Removed {
		t.State = nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_REMOVED
	}
	return t
}

// Replaced is true once the record is being deleted for a reason after
// which its group creates a successor (its size is kept): rotation,
// unhealthy, spot termination, expiry, or DeleteInstance of a group member.
// Scale-down and group deletion leave no successor, and neither does an
// instance outside a group or created on demand.
func (r *Record) Replaced() bool {
	if r.GroupID == "" || r.OnDemand || r.ClientToken != "" {
		return false
	}
	switch r.DeletionReason {
	case nstancev1.DeletionReason_DELETION_REASON_ROTATION, nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY,
		nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION, nstancev1.DeletionReason_DELETION_REASON_EXPIRY,
		nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE:
		return true
	}
	return false
}

// NewID returns a fresh instance id "{prefix}-{8 hex}", a DNS label. The
// prefix (group id or template) is lower-cased, stripped of characters a DNS
// label cannot hold and cut so the id stays within 63 characters.
func NewID(prefix string) (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating instance id: %w", err)
	}
	clean := make([]byte, 0, len(prefix))
	for _, c := range []byte(prefix) {
		switch {
		case c >= 'A' && c <= 'Z':
			clean = append(clean, c+'a'-'A')
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			clean = append(clean, c)
		case c == '-' || c == '_' || c == '.':
			if len(clean) > 0 && clean[len(clean)-1] != '-' {
				clean = append(clean, '-')
			}
		}
	}
	for len(clean) > 0 && clean[len(clean)-1] == '-' {
		clean = clean[:len(clean)-1]
	}
	if len(clean) > 54 {
		clean = clean[:54]
		for len(clean) > 0 && clean[len(clean)-1] == '-' {
			clean = clean[:len(clean)-1]
		}
	}
	if len(clean) == 0 {
		clean = []byte("i")
	}
	return string(clean) + "-" + hex.EncodeToString(b), nil
}
