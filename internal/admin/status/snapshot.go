package status

import (
	"reflect"
	"sort"
	"strings"
	"time"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Snapshot is what the page shows, for every shard.
type Snapshot struct {
	// GeneratedAt is the collector's clock when the snapshot was taken; the
	// page measures health ages against it.
	GeneratedAt time.Time     `json:"generatedAt"`
	Shards      []ShardStatus `json:"shards"`
	// Errors are the most recent errors of every shard, newest first.
	Errors []ErrorEntry `json:"errors"`
}

// ShardStatus is one shard as its serving leader reports it.
type ShardStatus struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	// Reachable is false when the last refresh failed; Error says why and
	// the groups and instances are those of the last successful refresh.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Leader is the server that answered (the shard leader).
	Leader       string     `json:"leader,omitempty"`
	LeaderSince  *time.Time `json:"leaderSince,omitempty"`
	ConfigETag   string     `json:"configETag,omitempty"`
	ConfigLoaded *time.Time `json:"configLoaded,omitempty"`
	// RefreshedAt is when the groups and instances were last listed.
	RefreshedAt *time.Time `json:"refreshedAt,omitempty"`
	Groups      []GroupRow `json:"groups"`
	Instances   []Instance `json:"instances"`
}

// GroupRow is one group: desired size, members, ready members and those
// being replaced or removed (rotating).
type GroupRow struct {
	ID       string `json:"id"`
	Desired  uint32 `json:"desired"`
	Actual   uint32 `json:"actual"`
	Ready    uint32 `json:"ready"`
	Rotating int    `json:"rotating"`
	Static   bool   `json:"static,omitempty"`
}

// Instance is one instance row.
type Instance struct {
	ID            string     `json:"id"`
	Group         string     `json:"group"`
	State         string     `json:"state"`
	ProviderID    string     `json:"providerID,omitempty"`
	Created       *time.Time `json:"created,omitempty"`
	LastHealth    *time.Time `json:"lastHealth,omitempty"`
	DrainDeadline *time.Time `json:"drainDeadline,omitempty"`
	AgentVersion  string     `json:"agentVersion,omitempty"`
	// LoadBalancers is "name: state" per load balancer, with the last
	// error in parentheses ("www: registered, api: pending (…)").
	LoadBalancers string `json:"loadBalancers,omitempty"`
	Message       string `json:"message,omitempty"`
}

// ErrorEntry is one error a shard reported.
type ErrorEntry struct {
	Shard    string    `json:"shard"`
	Group    string    `json:"group,omitempty"`
	Instance string    `json:"instance,omitempty"`
	Source   string    `json:"source,omitempty"`
	Message  string    `json:"message"`
	At       time.Time `json:"at"`
}

// stateName is the enum name without its prefix, lower case ("running").
func stateName(s nstancev1.InstanceState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "INSTANCE_STATE_"))
}

// leaving reports whether an instance is on its way out (drained or being
// deleted): a group's rotating count.
func leaving(s nstancev1.InstanceState) bool {
	return s == nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION || s == nstancev1.InstanceState_INSTANCE_STATE_DELETING
}

func ts(t interface {
	IsValid() bool
	AsTime() time.Time
}) *time.Time {
	if t == nil || !t.IsValid() {
		return nil
	}
	v := t.AsTime().UTC()
	return &v
}

// rows turns a shard's listing into the page's rows, sorted by id.
func rows(groups []*nstancev1.GroupStatus, insts []*nstancev1.InstanceStatus) ([]GroupRow, []Instance) {
	rotating := map[string]int{}
	out := make([]Instance, 0, len(insts))
	for _, in := range insts {
		if leaving(in.GetState()) {
			rotating[in.GetGroupId()]++
		}
		row := Instance{
			ID: in.GetInstanceId(), Group: in.GetGroupId(), State: stateName(in.GetState()),
			ProviderID: in.GetProviderId(), Message: in.GetMessage(),
			AgentVersion: in.GetAgentVersion(), LoadBalancers: lbSummary(in.GetLoadBalancers()),
		}
		if in.GetCreatedAt() != nil {
			row.Created = ts(in.GetCreatedAt())
		}
		if in.GetLastHealthAt() != nil {
			row.LastHealth = ts(in.GetLastHealthAt())
		}
		if in.GetDrainDeadline() != nil {
			row.DrainDeadline = ts(in.GetDrainDeadline())
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	gs := make([]GroupRow, 0, len(groups))
	for _, g := range groups {
		id := g.GetSpec().GetGroupId()
		gs = append(gs, GroupRow{ID: id, Desired: g.GetSpec().GetSize(), Actual: g.GetActualSize(),
			Ready: g.GetReadyCount(), Rotating: rotating[id], Static: g.GetStatic()})
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].ID < gs[j].ID })
	return gs, out
}

func errorSourceName(s nstancev1.ErrorSource) string {
	if s == nstancev1.ErrorSource_ERROR_SOURCE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "ERROR_SOURCE_"))
}

// equalShard compares two shard states, ignoring when they were listed.
func equalShard(a, b ShardStatus) bool {
	a.RefreshedAt, b.RefreshedAt = nil, nil
	return reflect.DeepEqual(a, b)
}

// lbSummary is an instance's load balancer column.
func lbSummary(ts []*nstancev1.LoadBalancerTarget) string {
	parts := make([]string, 0, len(ts))
	for _, t := range ts {
		p := t.GetName() + ": " + strings.ToLower(strings.TrimPrefix(t.GetState().String(), "LOAD_BALANCER_TARGET_STATE_"))
		if e := t.GetLastError(); e != "" {
			p += " (" + e + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}
