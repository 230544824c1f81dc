package manager_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/cluster"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	"github.com/nstance-dev/nstance/internal/operator/shardgroup"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// activeMembers lists the members of group on a shard that still count.
func activeMembers(t *testing.T, cl nstancev1.OperatorServiceClient, group string) []string {
	t.Helper()
	resp, err := cl.ListInstances(context.Background(), &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
	require.NoError(t, err)
	return shardgroup.Remaining(resp.GetInstances())
}

// TestRemovedShardGroupDeletedWhenBack: a shard removed from the operator
// config is reported on the objects that name it; deleting the pool then
// releases that shard's group without DeleteGroup (nothing blocks), records
// it as orphaned in the ledger, and when the shard is configured again the
// operator deletes the group there and forgets it.
func TestRemovedShardGroupDeletedWhenBack(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	f.createPool(t, "web", 2, "shard-a", "shard-b")
	clients := map[string]nstancev1.OperatorServiceClient{"shard-a": f.shards["shard-a"].client(t), "shard-b": f.shards["shard-b"].client(t)}
	var onB []string
	require.Eventually(t, func() bool {
		onB = activeMembers(t, clients["shard-b"], "web")
		return len(activeMembers(t, clients["shard-a"], "web")) == 1 && len(onB) == 1
	}, waitLong, tick, "one member per shard")
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, onB[0], &infrav1.NstanceMachine{})
		return ok
	}, waitLong, tick, "the pool mirrors shard B's instance")
	r.stop()

	// shard-b leaves the config.
	o := f.options(t)
	delete(o.Config.Shards, "shard-b")
	r = startOperator(t, o)
	r.waitImported(t)
	sgB := infrav1.ShardGroupName("web", "shard-b")
	require.Eventually(t, func() bool {
		sg, _ := get(t, f.ns, sgB, &infrav1.NstanceShardGroup{})
		c := meta.FindStatusCondition(sg.Status.Conditions, infrav1.ShardReachableCondition)
		return c != nil && c.Reason == infrav1.UnknownShardReason && len(f.events(t, "NstanceShardGroup", sgB, shardgroup.EventUnknownShard)) > 0
	}, waitLong, tick, "the shard group reports the unconfigured shard")
	require.Eventually(t, func() bool {
		nm, _ := get(t, f.ns, onB[0], &infrav1.NstanceMachine{})
		c := meta.FindStatusCondition(nm.Status.Conditions, machine.ConditionReady)
		return c != nil && c.Reason == machine.ReasonUnknownShard
	}, waitLong, tick, "the pool's NstanceMachine on shard-b reports the unconfigured shard")

	mp, _ := get(t, f.ns, "web", &clusterv1.MachinePool{})
	require.NoError(t, env.Client.Delete(ctx, mp))
	pool, _ := get(t, f.ns, "web", &infrav1.NstanceMachinePool{})
	require.NoError(t, env.Client.Delete(ctx, pool))
	require.Eventually(t, func() bool {
		_, pok := get(t, f.ns, "web", &infrav1.NstanceMachinePool{})
		_, sok := get(t, f.ns, sgB, &infrav1.NstanceShardGroup{})
		return !pok && !sok
	}, waitLong, tick, "the pool and its shard groups go, the unconfigured shard's too")
	require.Empty(t, activeMembers(t, clients["shard-a"], "web"), "shard-a's group was deleted as usual")
	require.Equal(t, onB, activeMembers(t, clients["shard-b"], "web"), "nobody told shard-b yet")
	entries, err := ledger.New(env.Client, f.ns, "").Load(ctx, env.Client)
	require.NoError(t, err)
	require.Equal(t, []ledger.Orphan{{Group: "web", Shard: "shard-b"}}, ledger.Orphans(entries))
	r.stop()

	// shard-b is configured again: its group goes and the record with it.
	r = startOperator(t, f.options(t))
	r.waitImported(t)
	require.Empty(t, r.op.ImportResult.Imported, "the orphaned group is not imported as a pool")
	require.Eventually(t, func() bool {
		if f.shards["shard-b"].group(t, "web") != nil || len(activeMembers(t, clients["shard-b"], "web")) > 0 {
			return false
		}
		entries, err := ledger.New(env.Client, f.ns, "").Load(ctx, env.Client)
		require.NoError(t, err)
		return len(ledger.Orphans(entries)) == 0
	}, waitLong, tick, "the orphaned group is deleted on shard-b and forgotten")
}

// TestStaticPoolMachineDeletionTerminates: deleting the NstanceMachine of
// a static pool's instance (what core CAPI does after the Machine is
// deleted and drained) deletes that instance, the server's static group
// replaces it, and the finalizer goes. The MachinePool is never written,
// so the webhook that refuses scaling a static MachinePool is never asked.
func TestStaticPoolMachineDeletionTerminates(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	startStaticShard(t, f, "shard-s")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	cl := f.shards["shard-s"].client(t)
	var ids []string
	require.Eventually(t, func() bool {
		ids = activeMembers(t, cl, "edge")
		if len(ids) != 2 {
			return false
		}
		for _, id := range ids {
			if _, ok := get(t, f.ns, id, &infrav1.NstanceMachine{}); !ok {
				return false
			}
		}
		return true
	}, waitLong, tick, "the static pool mirrors its two instances")
	mp, _ := get(t, f.ns, "edge", &clusterv1.MachinePool{})
	rv := mp.ResourceVersion

	victim, _ := get(t, f.ns, ids[0], &infrav1.NstanceMachine{})
	require.NoError(t, env.Client.Delete(ctx, victim))
	var last string
	if !assert.Eventually(t, func() bool {
		nm, ok := get(t, f.ns, ids[0], &infrav1.NstanceMachine{})
		resp, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{"edge"}})
		require.NoError(t, err)
		now := shardgroup.Remaining(resp.GetInstances())
		last = fmt.Sprintf("NstanceMachine %s present=%v finalizers=%v conditions=%v; server: %v", ids[0], ok, nm.Finalizers, nm.Status.Conditions, resp.GetInstances())
		return !ok && len(now) == 2 && !slices.Contains(now, ids[0])
	}, waitLong, tick) {
		t.Fatalf("the NstanceMachine goes with its instance and the static group replaces it; last seen: %s", last)
	}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(mp), mp))
	require.Equal(t, rv, mp.ResourceVersion, "the MachinePool was not written")
	require.EqualValues(t, 2, *mp.Spec.Replicas)
}

// TestNstanceClusterDeletionTakesClusterOwnedShardGroup: the shard group
// the MachineDeployment template declares is owned by the Cluster, so the
// garbage collector would delete it only after the Cluster, which waits for
// the NstanceCluster. The NstanceCluster's deletion deletes it, waits until
// the server has no member of its group left, and only then lets go.
func TestNstanceClusterDeletionTakesClusterOwnedShardGroup(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	cl := f.shards["shard-a"].client(t)
	sgName := infrav1.ShardGroupName("md-0", "shard-a")
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceShardGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: sgName, Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec:       infrav1.NstanceShardGroupSpec{Group: "md-0", Shard: "shard-a", Size: 1, Template: "worker", DrainTimeout: &metav1.Duration{Duration: 100 * time.Millisecond}},
	}))
	var ids []string
	var nc *infrav1.NstanceCluster
	require.Eventually(t, func() bool {
		sg, _ := get(t, f.ns, sgName, &infrav1.NstanceShardGroup{})
		ids = activeMembers(t, cl, "md-0")
		var ok bool
		nc, ok = get(t, f.ns, clusterID, &infrav1.NstanceCluster{})
		return len(ids) == 1 && len(sg.OwnerReferences) == 1 && sg.OwnerReferences[0].Kind == "Cluster" &&
			ok && slices.Contains(nc.Finalizers, infrav1.ClusterFinalizer)
	}, waitLong, tick, "the shard group runs its member and has its Cluster as owner; the NstanceCluster holds its finalizer")

	require.NoError(t, env.Client.Delete(ctx, nc))
	require.Eventually(t, func() bool {
		_, ncOK := get(t, f.ns, clusterID, &infrav1.NstanceCluster{})
		_, sgOK := get(t, f.ns, sgName, &infrav1.NstanceShardGroup{})
		return !ncOK && !sgOK
	}, waitLong, tick, "the NstanceCluster deletes the Cluster's shard group and goes after it")
	require.Empty(t, activeMembers(t, cl, "md-0"), "no member of the group is left when the NstanceCluster is gone")
	require.NotEmpty(t, f.events(t, "NstanceCluster", clusterID, cluster.EventInstancesDeleted))
}
