package nodejoin

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// DefaultTimeout is the join timeout when none is configured.
const DefaultTimeout = 10 * time.Minute

// Instance is what the decision needs of one instance a shard reports.
type Instance struct {
	Shard, ID, Group, ProviderID string
	// OnDemand: created by CreateInstance (an NstanceMachine's or an
	// on-demand pod's), not a member the group keeps at its size.
	OnDemand bool
	State    nstancev1.InstanceState
	// FirstHealthAt is when the server recorded the agent's first health
	// report; zero before it.
	FirstHealthAt time.Time
	// Joined: its Node was Ready before (seen by the runner or recorded on
	// its NstanceMachine).
	Joined bool
	// Timeout overrides Input.Timeout (its pool's spec.joinTimeout): zero
	// keeps Input.Timeout, negative means no deadline for this instance.
	Timeout time.Duration
}

// Key names the instance: "{shard}/{id}".
func (i Instance) Key() string { return i.Shard + "/" + i.ID }

// Node is what the decision needs of one workload Node.
type Node struct {
	Name       string
	UID        types.UID
	ProviderID string
	// Ready is the Ready condition being True.
	Ready bool
	// ReadyChanged is the Ready condition's last transition; zero when the
	// Node has no Ready condition.
	ReadyChanged time.Time
}

// Input is one pass's view of the shards and the workload cluster.
type Input struct {
	Now     time.Time
	Timeout time.Duration
	// ClusterID is the Nstance cluster: Nodes with the provider-ID prefix
	// nstance://{ClusterID}/ are ours.
	ClusterID string
	// Instances of every shard that answered this pass.
	Instances []Instance
	// Unanswered shards: their instances are unknown, so no Node naming
	// them is called an orphan.
	Unanswered map[string]bool
	Nodes      []Node
	// Reported are the orphan Nodes reported already (by UID).
	Reported map[types.UID]bool
}

// Late is an instance whose Node did not become Ready in time.
type Late struct {
	Instance Instance
	// Node is the name of its NotReady Node; empty when there is none.
	Node     string
	Deadline time.Time
	// Message says what is wrong, naming the provider ID and how long.
	Message string
}

// Orphan is a Node with our provider-ID prefix that no instance holds.
type Orphan struct {
	Node Node
	// New: not reported before; report it now.
	New bool
}

// Decision is what a pass should do.
type Decision struct {
	// Late instances: mark and replace.
	Late []Late
	// Joined instances whose Node is Ready now and that were not known to
	// have joined: remember them.
	Joined []Instance
	// Orphans are every current orphan Node (so the reported set can be
	// pruned to them); those with New set are reported.
	Orphans []Orphan
	// Next is the earliest deadline still ahead (zero when none), so a
	// runner may look again then.
	Next time.Time
}

// ProviderIDPrefix is the provider-ID prefix of the instances of cluster.
func ProviderIDPrefix(cluster string) string { return "nstance://" + cluster + "/" }

// considered reports whether an instance in state s is subject to the join
// deadline: one being removed, or whose VM is gone, is not.
func considered(s nstancev1.InstanceState) bool {
	switch s {
	case nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, nstancev1.InstanceState_INSTANCE_STATE_DELETING,
		nstancev1.InstanceState_INSTANCE_STATE_DELETED, nstancev1.InstanceState_INSTANCE_STATE_STOPPED:
		return false
	}
	return true
}

// Decide applies the join deadline to one pass's view.
//
//   - An instance that never reported (no first_health_at), has no provider
//     ID, is pending deletion, deleting, deleted or stopped is ignored.
//   - An instance whose Node is Ready has joined (returned in Joined unless
//     known already); one known to have joined is never late again.
//   - Past first_health_at + Timeout, an instance with no Node is late; one
//     whose Node is not Ready is late when the Ready condition is missing or
//     has not changed since the deadline (see the package comment).
//   - A Node whose provider ID has the prefix nstance://{ClusterID}/, that no
//     listed instance holds and that does not name an unanswered shard, is
//     an orphan; it is New unless in Reported.
//
// A zero or negative Input.Timeout decides nothing about instances; an
// instance's own Timeout (its pool's) replaces it when not zero.
func Decide(in Input) Decision {
	var d Decision
	byProvider := map[string]Node{}
	for _, n := range in.Nodes {
		if n.ProviderID == "" {
			continue
		}
		// Of several Nodes with one provider ID, a Ready one counts.
		if old, ok := byProvider[n.ProviderID]; !ok || !old.Ready && n.Ready {
			byProvider[n.ProviderID] = n
		}
	}
	held := map[string]bool{}
	for _, inst := range in.Instances {
		if inst.ProviderID != "" {
			held[inst.ProviderID] = true
		}
		timeout := in.Timeout
		if inst.Timeout != 0 {
			timeout = inst.Timeout
		}
		if in.Timeout <= 0 || timeout <= 0 || inst.ProviderID == "" || !considered(inst.State) {
			continue
		}
		node, hasNode := byProvider[inst.ProviderID]
		if hasNode && node.Ready {
			if !inst.Joined {
				d.Joined = append(d.Joined, inst)
			}
			continue
		}
		if inst.Joined || inst.FirstHealthAt.IsZero() {
			continue
		}
		deadline := inst.FirstHealthAt.Add(timeout)
		if in.Now.Before(deadline) {
			if d.Next.IsZero() || deadline.Before(d.Next) {
				d.Next = deadline
			}
			continue
		}
		since := in.Now.Sub(inst.FirstHealthAt).Round(time.Second)
		switch {
		case !hasNode:
			d.Late = append(d.Late, Late{Instance: inst, Deadline: deadline, Message: fmt.Sprintf(
				"no Node with providerID %s became Ready within the join timeout %s: none registered %s after the agent's first health report",
				inst.ProviderID, timeout, since)})
		case node.ReadyChanged.IsZero() || !node.ReadyChanged.After(deadline):
			d.Late = append(d.Late, Late{Instance: inst, Node: node.Name, Deadline: deadline, Message: fmt.Sprintf(
				"Node %s with providerID %s did not become Ready within the join timeout %s: not Ready %s after the agent's first health report",
				node.Name, inst.ProviderID, timeout, since)})
		}
		// Otherwise the Ready condition changed after the deadline and the
		// Node's history is unknown: left to health checks.
	}
	prefix := ProviderIDPrefix(in.ClusterID)
	for _, n := range in.Nodes {
		if !strings.HasPrefix(n.ProviderID, prefix) || held[n.ProviderID] {
			continue
		}
		shard, _, _ := strings.Cut(strings.TrimPrefix(n.ProviderID, prefix), "/")
		if in.Unanswered[shard] {
			continue
		}
		d.Orphans = append(d.Orphans, Orphan{Node: n, New: !in.Reported[n.UID]})
	}
	slices.SortFunc(d.Late, func(a, b Late) int { return strings.Compare(a.Instance.Key(), b.Instance.Key()) })
	slices.SortFunc(d.Orphans, func(a, b Orphan) int { return strings.Compare(a.Node.Name, b.Node.Name) })
	return d
}
