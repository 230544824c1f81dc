package cluster

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/operator/ledger"
)

// Condition reasons of a deleted NstanceCluster (Ready false).
const (
	// ReasonWaitingForObjects: Nstance objects of the cluster (pools, shard
	// groups, machines) still exist; each waits for its own instances.
	ReasonWaitingForObjects = "WaitingForObjects"
	// ReasonDeletingInstances: a shard still reports instances of the
	// cluster's groups.
	ReasonDeletingInstances = "DeletingInstances"
	// ReasonWaitingForShard: a shard cannot be asked; deletion waits for it
	// (or for the abandon annotation on the Cluster).
	ReasonWaitingForShard = "WaitingForShard"
)

// Event reasons of a deleted NstanceCluster.
const (
	// EventInstancesDeleted: no instance of the cluster is left on any
	// configured shard; the finalizer goes.
	EventInstancesDeleted = "InstancesDeleted"
	// EventOrphanedGroups: groups left on shards that are no longer
	// configured (deleted there when the shard is configured again).
	EventOrphanedGroups = "OrphanedGroups"
)

// ShardState is what one configured shard told about the cluster's groups.
type ShardState struct {
	Shard string
	// Err is why the shard could not be asked; empty when it answered.
	Err string
	// Left holds, per group, the instances still there (Remaining: any
	// state but deleted or failed, pending and surge ones included).
	Left map[string][]string
	// Groups are the cluster's groups that may have instances on the shard:
	// what an abandoned shard leaves behind.
	Groups []string
}

// DeleteInput is everything the deletion of an NstanceCluster decides on.
type DeleteInput struct {
	// Objects are the cluster's Nstance objects still present ("Kind/name").
	Objects []string
	// Shards are the configured shards, in order.
	Shards []ShardState
	// Unconfigured are groups the ledger records as left on shards that are
	// not configured: reported, never waited for (no shard to ask).
	Unconfigured []ledger.Orphan
	// Abandon is the Cluster's abandon annotation.
	Abandon bool
}

// DeleteDecision is what to do with a deleted NstanceCluster.
type DeleteDecision struct {
	// Release: the finalizer goes.
	Release bool
	// Reason and Message describe what deletion waits for (Ready false).
	Reason, Message string
	// Abandoned are the unreachable shards given up (Abandon), with the
	// groups that may have instances there.
	Abandoned []ShardState
}

// DecideDelete is the deletion policy of an NstanceCluster: it waits until
// none of the cluster's objects is left and every configured shard answers
// with no instance of the cluster's groups. A shard that cannot be asked is
// waited for, unless the Cluster carries the abandon annotation: then it is
// given up (Abandoned) and deletion goes on. Reachable shards are always
// waited for.
func DecideDelete(in DeleteInput) DeleteDecision {
	var d DeleteDecision
	var waits []string
	if n := len(in.Objects); n > 0 {
		d.Reason = ReasonWaitingForObjects
		waits = append(waits, fmt.Sprintf("%d objects of the cluster to be deleted (%s)", n, list(in.Objects, 5)))
	}
	for _, s := range in.Shards {
		switch {
		case s.Err != "" && in.Abandon:
			d.Abandoned = append(d.Abandoned, s)
		case s.Err != "":
			d.Reason = firstReason(d.Reason, ReasonWaitingForShard)
			waits = append(waits, fmt.Sprintf("shard %s, which cannot be reached (%s)", s.Shard, s.Err))
		case len(s.Left) > 0:
			d.Reason = firstReason(d.Reason, ReasonDeletingInstances)
			var n int
			var parts []string
			for _, g := range slices.Sorted(maps.Keys(s.Left)) {
				n += len(s.Left[g])
				parts = append(parts, fmt.Sprintf("%s: %s", g, list(s.Left[g], 5)))
			}
			waits = append(waits, fmt.Sprintf("%d instances on shard %s (%s)", n, s.Shard, strings.Join(parts, "; ")))
		}
	}
	if len(waits) == 0 {
		d.Release = true
		return d
	}
	d.Message = "waiting for " + strings.Join(waits, ", and ")
	return d
}

func firstReason(have, next string) string {
	if have != "" {
		return have
	}
	return next
}

// list joins at most n items and says how many more there are.
func list(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}

// OwnerKinds are the owners that delete an Nstance object of the cluster
// in their own time: core CAPI deletes MachinePools and Machines before the
// NstanceCluster, and a pool deletes its shard groups and machines.
var OwnerKinds = []string{"MachinePool", "Machine", "NstanceMachinePool"}

// DeletedWithCluster reports whether the NstanceCluster's deletion must
// delete an object of its cluster with these owners itself: one that no
// MachinePool, Machine or pool owns (the MachineDeployment template's shard
// group, owned by the Cluster; an object nothing owns), and, once no
// MachinePool or Machine of the cluster is left (capiLeft false), every
// one: its owners are gone or going, and the garbage collector would delete
// it only after them (a pool's NstanceMachine whose Machine core CAPI never
// created). The garbage collector would delete a Cluster-owned one only
// after the Cluster is gone, which waits for the NstanceCluster: a
// deadlock.
func DeletedWithCluster(owners []metav1.OwnerReference, capiLeft bool) bool {
	if !capiLeft {
		return true
	}
	for _, o := range owners {
		if slices.Contains(OwnerKinds, o.Kind) {
			return false
		}
	}
	return true
}
