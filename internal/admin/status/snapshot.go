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
	// Figures are those of the agent's last report (nil before one).
	Figures *Figures `json:"figures,omitempty"`
}

// Figures summarise an instance's last health report for its row.
type Figures struct {
	// CPUPercent is the busy share of all cores since the report before,
	// CoreMaxPercent the busiest core's.
	CPUPercent     float64 `json:"cpuPercent"`
	CoreMaxPercent float64 `json:"coreMaxPercent"`
	Load1          float64 `json:"load1"`
	// MemoryPercent is memory in use; DiskPercent the fullest disk's use.
	MemoryPercent float64 `json:"memoryPercent"`
	DiskPercent   float64 `json:"diskPercent"`
	// RxBytes and TxBytes are every interface's counters summed, Dropped
	// their dropped packets (both ways).
	RxBytes uint64 `json:"rxBytes"`
	TxBytes uint64 `json:"txBytes"`
	Dropped uint64 `json:"dropped"`
	// ConntrackEntries of ConntrackMax (both 0 without conntrack).
	ConntrackEntries uint64 `json:"conntrackEntries"`
	ConntrackMax     uint64 `json:"conntrackMax"`
	// Files delivered, FileErrors of them in error.
	Files      int `json:"files"`
	FileErrors int `json:"fileErrors"`
}

func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) * 100 / float64(whole)
}

// figures summarises a health report (nil for none).
func figures(r *nstancev1.HealthReport) *Figures {
	if r == nil {
		return nil
	}
	f := &Figures{CPUPercent: r.GetCpu().GetUsagePercent(), Load1: r.GetCpu().GetLoad1(),
		MemoryPercent:    share(r.GetMemory().GetUsedBytes(), r.GetMemory().GetTotalBytes()),
		ConntrackEntries: r.GetConntrackEntries(), ConntrackMax: r.GetConntrackMax(), Files: len(r.GetFiles())}
	for _, c := range r.GetCpu().GetCoreUsagePercent() {
		f.CoreMaxPercent = max(f.CoreMaxPercent, c)
	}
	for _, d := range r.GetDisks() {
		f.DiskPercent = max(f.DiskPercent, share(d.GetUsedBytes(), d.GetTotalBytes()))
	}
	for _, n := range r.GetNetworkInterfaces() {
		f.RxBytes += n.GetRxBytes()
		f.TxBytes += n.GetTxBytes()
		f.Dropped += n.GetRxDropped() + n.GetTxDropped()
	}
	for _, fs := range r.GetFiles() {
		if fs.GetState() == nstancev1.FileState_FILE_STATE_ERROR {
			f.FileErrors++
		}
	}
	return f
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
			AgentVersion: in.GetAgentVersion(), LoadBalancers: lbSummary(in.GetLoadBalancers()), Figures: figures(in.GetLastReport()),
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
