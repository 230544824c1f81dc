package manager_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/importer"
	"github.com/nstance-dev/nstance/internal/operator/shardgroup"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// absentWindow is how long a test watches for an object the operator must
// not create. The operator's startup sync runs right after its shard
// connections are ready, so a creation would show within milliseconds.
const absentWindow = 2 * time.Second

// waitShardsReady waits until the operator's connection to every shard is
// ready: its startup sync has then gone past the point where an older
// operator created the Cluster objects.
func waitShardsReady(t *testing.T, r *running, shards ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	for _, s := range shards {
		require.NoError(t, r.op.Conns.WaitReady(ctx, s), "shard %s ready", s)
	}
}

// TestDeletedClusterStaysDeleted: Cluster objects are the user's. A deleted
// Cluster (and its NstanceCluster and NstanceControlPlane) is not created
// again by a restarted operator, and the import waits for a Cluster rather
// than importing pools of none.
func TestDeletedClusterStaysDeleted(t *testing.T) {
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	ctx := context.Background()
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	for _, o := range []client.Object{&clusterv1.Cluster{}, &infrav1.NstanceCluster{}, &cpv1.NstanceControlPlane{}} {
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: clusterID}, o))
		require.NoError(t, env.Client.Delete(ctx, o))
	}
	// The NstanceCluster's finalizer goes once no instance of the cluster
	// is left (none here).
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, clusterID, &infrav1.NstanceCluster{})
		return !ok
	}, waitLong, tick, "the deleted NstanceCluster goes")
	r.stop()
	_, err := f.shards["shard-a"].client(t).UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "orphan", Template: "worker", Size: 1}})
	require.NoError(t, err)

	r = startOperatorOnly(t, f.options(t))
	waitShardsReady(t, r, "shard-a")
	require.Never(t, func() bool {
		for _, o := range []client.Object{&clusterv1.Cluster{}, &infrav1.NstanceCluster{}, &cpv1.NstanceControlPlane{}, &infrav1.NstanceMachinePool{}} {
			name := clusterID
			if _, ok := o.(*infrav1.NstanceMachinePool); ok {
				name = "orphan"
			}
			if _, ok := get(t, f.ns, name, o); ok {
				return true
			}
		}
		return false
	}, absentWindow, tick, "no Cluster object is created again, and no pool is imported without a Cluster")
	select {
	case <-r.op.Imported:
		t.Fatal("the import ran without a Cluster")
	default:
	}
}

// moveObjectKinds are what clusterctl move brings for the operator's
// objects in this test (no core CAPI runs here, so no Machines): owners
// first.
var moveObjectKinds = []schema.GroupVersionKind{
	clusterv1.GroupVersion.WithKind("Cluster"),
	infrav1.GroupVersion.WithKind("NstanceCluster"),
	cpv1.GroupVersion.WithKind("NstanceControlPlane"),
	clusterv1.GroupVersion.WithKind("MachinePool"),
	infrav1.GroupVersion.WithKind("NstanceMachinePool"),
	infrav1.GroupVersion.WithKind("NstanceShardGroup"),
}

// TestMoveOntoFreshOperatorImportsNothing: clusterctl init on a move
// target starts an operator with nothing in its namespace; the move then
// brings the Cluster (paused), the pools, their shard groups and the ledger.
// The operator imports nothing before the Cluster arrives and finds every
// group known once it resumes: no duplicate pool, no server group resized.
func TestMoveOntoFreshOperatorImportsNothing(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	ctx := context.Background()
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	f.createPool(t, "workers", 3, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "workers", "shard-a", "shard-b"), [][2]int{{2, 2}, {1, 1}})
	}, waitLong, tick)
	var cl clusterv1.Cluster
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &cl))
	cl.Spec.Paused = ptr.To(true)
	require.NoError(t, env.Client.Update(ctx, &cl))
	r.stop()

	// Read what the move brings, then take it out of the namespace
	// (finalizers first), as if this were a new management cluster.
	var objs []*unstructured.Unstructured
	for _, gvk := range moveObjectKinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		require.NoError(t, env.Client.List(ctx, list, client.InNamespace(f.ns)))
		for i := range list.Items {
			objs = append(objs, &list.Items[i])
		}
	}
	ledger := &unstructured.Unstructured{}
	ledger.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "nstance-operator-groups"}, ledger))
	objs = append(objs, ledger)
	require.NoError(t, kubetest.MoveAway(ctx, env.Client, objs, waitLong))

	// clusterctl init: a fresh operator. Its server groups are there, its
	// Cluster is not: it must not import them.
	r = startOperatorOnly(t, f.options(t))
	waitShardsReady(t, r, "shard-a", "shard-b")
	require.Never(t, func() bool {
		var pools infrav1.NstanceMachinePoolList
		require.NoError(t, env.Client.List(ctx, &pools, client.InNamespace(f.ns)))
		return len(pools.Items) > 0
	}, absentWindow, tick, "nothing imported before the move arrives")

	// clusterctl move: owners first, new UIDs, no status, Cluster paused;
	// the fresh operator's own ledger is updated.
	require.NoError(t, kubetest.MoveIn(ctx, env.Client, objs, true))
	require.Eventually(t, func() bool {
		var c clusterv1.Cluster
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &c); err != nil {
			return false
		}
		c.Spec.Paused = ptr.To(false)
		return env.Client.Update(ctx, &c) == nil
	}, waitLong, tick, "unpause the moved Cluster")

	r.waitImported(t)
	require.Empty(t, r.op.ImportResult.Imported)
	require.Equal(t, 1, r.op.ImportResult.Known)
	var pools infrav1.NstanceMachinePoolList
	require.NoError(t, env.Client.List(ctx, &pools, client.InNamespace(f.ns)))
	require.Len(t, pools.Items, 1)
	require.Equal(t, "workers", pools.Items[0].Name)
	require.NotContains(t, pools.Items[0].Annotations, importer.ImportedAnnotation)
	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "workers", &infrav1.NstanceMachinePool{})
		return p.Status.Ready && len(p.Spec.ProviderIDList) == 3
	}, waitLong, tick, "the moved pool runs its three instances")
	require.Equal(t, [][2]int{{2, 2}, {1, 1}}, f.serverSizes(t, "workers", "shard-a", "shard-b"))
}

// TestPoolInAnotherNamespace: with the default flags (no --namespace) the
// operator reconciles a pool in a namespace other than its own: shard
// groups are pushed, server group events come back to them (their Ready
// status), scaling and deletion follow. It runs on an API server of its own
// so that no other test's objects are watched.
func TestPoolInAnotherNamespace(t *testing.T) {
	shared := env
	env = kubetest.Start(t)
	t.Cleanup(func() { env = shared })
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	ctx := context.Background()
	opts := f.options(t)
	opts.WatchNamespace = "" // the default: every namespace
	r := startOperator(t, opts)
	r.waitImported(t)

	team := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "team-"}}
	require.NoError(t, env.Client.Create(ctx, team))
	require.NotEqual(t, f.ns, team.Name)
	createPoolIn(t, team.Name, "team-workers", 2, 100*time.Millisecond, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "team-workers", "shard-a", "shard-b"), [][2]int{{1, 1}, {1, 1}})
	}, waitLong, tick, "the pool's groups run on both shards")
	require.Eventually(t, func() bool {
		p, _ := get(t, team.Name, "team-workers", &infrav1.NstanceMachinePool{})
		return p.Status.Ready && len(p.Spec.ProviderIDList) == 2
	}, waitLong, tick, "the pool in %s is ready with two provider IDs", team.Name)
	_, ok := get(t, team.Name, "team-workers--shard-a", &infrav1.NstanceShardGroup{})
	require.True(t, ok, "shard groups live beside their pool")

	var mp clusterv1.MachinePool
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: team.Name, Name: "team-workers"}, &mp))
	mp.Spec.Replicas = ptr.To[int32](3)
	require.NoError(t, env.Client.Update(ctx, &mp))
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "team-workers", "shard-a", "shard-b"), [][2]int{{2, 2}, {1, 1}})
	}, waitLong, tick, "scaling follows")

	pool, _ := get(t, team.Name, "team-workers", &infrav1.NstanceMachinePool{})
	require.NoError(t, env.Client.Delete(ctx, pool))
	require.Eventually(t, func() bool {
		_, okPool := get(t, team.Name, "team-workers", &infrav1.NstanceMachinePool{})
		return !okPool && slices.Equal(f.serverSizes(t, "team-workers", "shard-a", "shard-b"), [][2]int{{-1, -1}, {-1, -1}})
	}, waitLong, tick, "deletion removes the server groups")
}

// TestShardGroupWaitsForMembers: a deleted pool's shard group keeps its
// finalizer until the server reports no member of its group. The member's
// drain is held by a PodDisruptionBudget until the drain deadline, so for
// those seconds the server still has it, and so must Kubernetes.
func TestShardGroupWaitsForMembers(t *testing.T) {
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	ctx := context.Background()
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	f.createPoolDrain(t, "held", 1, 3*time.Second, "shard-a")
	members := func() []string {
		resp, err := f.shards["shard-a"].client(t).ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{"held"}})
		require.NoError(t, err)
		return shardgroup.Remaining(resp.GetInstances())
	}
	var inst *nstancev1.InstanceStatus
	require.Eventually(t, func() bool {
		resp, err := f.shards["shard-a"].client(t).ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{"held"}})
		require.NoError(t, err)
		if len(resp.GetInstances()) != 1 || resp.GetInstances()[0].GetProviderId() == "" {
			return false
		}
		inst = resp.GetInstances()[0]
		return true
	}, waitLong, tick, "the pool runs its instance")
	createNode(t, env.Client, inst.GetInstanceId(), inst.GetProviderId())
	createPod(t, env.Client, f.ns, "guarded", inst.GetInstanceId(), plainPod, map[string]string{"app": "guarded"})
	createPDB(t, env.Client, f.ns, "guarded", map[string]string{"app": "guarded"})
	r.waitNodeCached(t, inst.GetProviderId())

	pool, _ := get(t, f.ns, "held", &infrav1.NstanceMachinePool{})
	require.NoError(t, env.Client.Delete(ctx, pool))
	waited := false
	require.Eventually(t, func() bool {
		left := members()
		sg, ok := get(t, f.ns, "held--shard-a", &infrav1.NstanceShardGroup{})
		if len(left) > 0 {
			require.True(t, ok, "shard group released while the server still has %v", left)
			if !sg.DeletionTimestamp.IsZero() && condition(sg.Status.Conditions, infrav1.ReadyCondition) == metav1.ConditionFalse {
				waited = true
			}
			return false
		}
		return !ok
	}, waitLong, tick, "the member goes at its drain deadline, then the shard group")
	require.True(t, waited, "the shard group was seen waiting for its member")
	require.NotEmpty(t, f.events(t, "NstanceShardGroup", "held--shard-a", shardgroup.EventGroupDeleted))
}

// TestStandaloneShardGroupOwnedByCluster: a shard group that nothing owns
// (the MachineDeployment template's) gets its Cluster as owner, so it goes
// with the Cluster; a pool's shard groups keep their pool as only owner.
func TestStandaloneShardGroupOwnedByCluster(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	var cl clusterv1.Cluster
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &cl))
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceShardGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: infrav1.ShardGroupName("md-0", "shard-a"),
			Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec: infrav1.NstanceShardGroupSpec{Group: "md-0", Shard: "shard-a", Size: 0, Template: "worker"},
	}))
	require.Eventually(t, func() bool {
		sg, _ := get(t, f.ns, "md-0--shard-a", &infrav1.NstanceShardGroup{})
		return len(sg.OwnerReferences) == 1 && sg.OwnerReferences[0].Kind == "Cluster" && sg.OwnerReferences[0].UID == cl.UID
	}, waitLong, tick, "the Cluster owns the standalone shard group")

	f.createPool(t, "pooled", 1, "shard-a")
	require.Eventually(t, func() bool {
		sg, ok := get(t, f.ns, "pooled--shard-a", &infrav1.NstanceShardGroup{})
		return ok && slices.Contains(sg.Finalizers, infrav1.ShardGroupFinalizer)
	}, waitLong, tick)
	sg, _ := get(t, f.ns, "pooled--shard-a", &infrav1.NstanceShardGroup{})
	require.Len(t, sg.OwnerReferences, 1)
	require.Equal(t, "NstanceMachinePool", sg.OwnerReferences[0].Kind)
}
