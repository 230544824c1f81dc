package machinepool

import (
	"cmp"
	"slices"
	"time"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// Member is one active member instance of a pool's group, as the planner
// sees it: where it runs, when it was created, and what Cluster API says
// about its Machine.
type Member struct {
	Shard      string
	InstanceID string
	Created    time.Time
	// Deleting: its Machine is being deleted.
	Deleting bool
	// DeleteMachine: its Machine carries cluster.x-k8s.io/delete-machine
	// (cluster-autoscaler's, or a user's, choice).
	DeleteMachine bool
	// Unhealthy: the instance is not running (or its Machine not healthy).
	Unhealthy bool
}

// Plan is what a pool's shard groups become: the size of every shard's
// group, and the members to mark for the scale-down (on_scale_down on
// their shard) before those sizes are written.
type Plan struct {
	Sizes   map[string]int32
	Victims []Member
}

// Delete priorities, highest first, as Cluster API's MachineSet orders its
// deletions.
const (
	prioDeleting = 3 // the Machine is being deleted
	prioMarked   = 2 // delete-machine annotation
	prioSick     = 1 // unhealthy
	prioAny      = 0
)

func priority(m Member) int {
	switch {
	case m.Deleting:
		return prioDeleting
	case m.DeleteMachine:
		return prioMarked
	case m.Unhealthy:
		return prioSick
	}
	return prioAny
}

// PlanReplicas decides the size of each shard's group for a pool that
// wants desired replicas over shards (in failure-domain order), whose
// groups have the current sizes (a shard missing from current has none),
// and which victims a scale-down removes.
//
// Growth adds one replica at a time to the shard with the fewest, the
// earlier shard in shards on a tie (from nothing this is an even split,
// the remainder to the first shards).
//
// A scale-down removes, in order:
//  1. the members whose Machines are being deleted or carry
//     delete-machine (Kubernetes' choice), each from its own shard;
//  2. replicas not realised by any member (a shard whose size exceeds its
//     members), so no running instance goes while a pending one would do;
//  3. members by policy: unhealthy first; then for Random the shard with
//     the most remaining replicas, then the instance id; for Oldest or
//     Newest the creation time over all shards, then the instance id.
//
// Every chosen member is a victim in the plan, and its shard shrinks by
// one. A shard never goes below zero, and members of shards outside
// shards are ignored. The plan depends only on its inputs, so a retry
// after a partial execution chooses the same victims.
func PlanReplicas(shards []string, current map[string]int32, members []Member, desired int32, policy infrav1.DeletePolicy) Plan {
	sizes := make(map[string]int32, len(shards))
	var total int32
	for _, s := range shards {
		sizes[s] = max(current[s], 0)
		total += sizes[s]
	}
	desired = max(desired, 0)
	p := Plan{Sizes: sizes}
	if len(shards) == 0 {
		return p
	}
	for ; total < desired; total++ {
		best := shards[0]
		for _, s := range shards[1:] {
			if sizes[s] < sizes[best] {
				best = s
			}
		}
		sizes[best]++
	}
	if total <= desired {
		return p
	}

	var cands []Member
	count := map[string]int32{} // members per shard
	for _, m := range members {
		if _, ok := sizes[m.Shard]; ok {
			cands = append(cands, m)
			count[m.Shard]++
		}
	}
	take := func(m Member) bool {
		if sizes[m.Shard] == 0 {
			return false
		}
		sizes[m.Shard]--
		count[m.Shard]--
		total--
		p.Victims = append(p.Victims, m)
		return true
	}

	// 1. Kubernetes' choice.
	slices.SortStableFunc(cands, func(a, b Member) int {
		return cmp.Or(cmp.Compare(priority(b), priority(a)), cmp.Compare(a.InstanceID, b.InstanceID))
	})
	rest := cands[:0:0]
	for _, m := range cands {
		if total > desired && priority(m) >= prioMarked && take(m) {
			continue
		}
		rest = append(rest, m)
	}

	// 2. Replicas no member stands for, from the shard with the most such.
	for total > desired {
		best, excess := "", int32(0)
		for _, s := range shards {
			if e := sizes[s] - count[s]; e > excess {
				best, excess = s, e
			}
		}
		if best == "" {
			break
		}
		sizes[best]--
		total--
	}

	// 3. The policy, one victim at a time (Random looks at the sizes left).
	for total > desired && len(rest) > 0 {
		i := pick(rest, sizes, shards, policy)
		m := rest[i]
		rest = slices.Delete(rest, i, i+1)
		take(m)
	}
	return p
}

// pick returns the index in ms of the next victim by policy.
func pick(ms []Member, sizes map[string]int32, shards []string, policy infrav1.DeletePolicy) int {
	order := func(s string) int { return slices.Index(shards, s) }
	less := func(a, b Member) int {
		if c := cmp.Compare(priority(b), priority(a)); c != 0 {
			return c
		}
		switch policy {
		case infrav1.DeletePolicyOldest:
			if c := a.Created.Compare(b.Created); c != 0 {
				return c
			}
		case infrav1.DeletePolicyNewest:
			if c := b.Created.Compare(a.Created); c != 0 {
				return c
			}
		default:
			// Keep the shards even: the one with the most replicas left,
			// the later one on a tie (growth fills the earlier first).
			if c := cmp.Compare(sizes[b.Shard], sizes[a.Shard]); c != 0 {
				return c
			}
			if c := cmp.Compare(order(b.Shard), order(a.Shard)); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.InstanceID, b.InstanceID)
	}
	best := 0
	for i := 1; i < len(ms); i++ {
		if sizes[ms[i].Shard] > 0 && (sizes[ms[best].Shard] == 0 || less(ms[i], ms[best]) < 0) {
			best = i
		}
	}
	return best
}
