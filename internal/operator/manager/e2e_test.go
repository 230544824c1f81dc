package manager_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestRegistrationLifecycle: a fresh start registers (keypair Secret, then
// certificate Secret), a restart reuses both without a nonce, and a crash
// right after the keypair is stored resumes with the same keypair. Leader
// election is on: the Lease is taken before anything is registered.
func TestRegistrationLifecycle(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)

	// Crash after the keypair is stored: the sync runnable fails, the
	// process would exit.
	crashing := f.options(t)
	crashing.LeaderElect = true
	crashing.AfterKeypairStored = func() error { return errors.New("injected crash") }
	r := startOperator(t, crashing)
	require.ErrorContains(t, r.exited(t), "injected crash")
	key, ok := get(t, f.ns, config.DefaultKeySecret, &corev1.Secret{})
	require.True(t, ok, "keypair Secret stored before the crash")
	_, ok = get(t, f.ns, config.DefaultCertSecret, &corev1.Secret{})
	require.False(t, ok, "no certificate Secret yet")
	lease, ok := get(t, f.ns, manager.LeaderElectionID, &coordinationv1.Lease{})
	require.True(t, ok, "leader election Lease exists")
	require.NotNil(t, lease.Spec.HolderIdentity)

	// Restart: resumes with the same keypair and registers.
	o := f.options(t)
	o.LeaderElect = true
	r = startOperator(t, o)
	r.waitImported(t)
	cert, ok := get(t, f.ns, config.DefaultCertSecret, &corev1.Secret{})
	require.True(t, ok)
	after, _ := get(t, f.ns, config.DefaultKeySecret, &corev1.Secret{})
	require.Equal(t, key.Data, after.Data, "same keypair after the crash")
	leaf, err := pki.ParseCertificatePEM(cert.Data[bootstrap.CertKey])
	require.NoError(t, err)
	pub, err := pki.ParseEd25519PublicKeyPEM(key.Data[bootstrap.PublicKeyKey])
	require.NoError(t, err)
	require.True(t, pub.Equal(leaf.PublicKey), "certificate issued for the stored key")
	require.Eventually(t, func() bool { return r.op.Conns.Healthy("shard-a") && r.op.Conns.Healthy("shard-b") }, waitLong, tick)
	r.stop()

	// Restart without the nonce: the stored certificate is reused.
	require.NoError(t, env.Client.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: config.DefaultNonceSecret}}))
	o = f.options(t)
	o.LeaderElect = true
	r = startOperator(t, o)
	r.waitImported(t)
	require.Eventually(t, func() bool { return r.op.Conns.Healthy("shard-a") && r.op.Conns.Healthy("shard-b") }, waitLong, tick)
	again, _ := get(t, f.ns, config.DefaultCertSecret, &corev1.Secret{})
	require.Equal(t, cert.Data, again.Data, "certificate reused, not re-registered")
}

func TestFatalWithoutNonce(t *testing.T) {
	f := newFixture(t, "shard-a")
	r := startOperator(t, f.options(t))
	err := r.exited(t)
	require.ErrorIs(t, err, bootstrap.ErrNonceMissing)
	require.ErrorContains(t, err, config.DefaultNonceSecret)
}

// serverSizes returns the spec size and actual size of group on each shard
// (-1 when the group does not exist there).
func (f *fixture) serverSizes(t testing.TB, group string, shards ...string) [][2]int {
	out := make([][2]int, len(shards))
	for i, s := range shards {
		g := f.shards[s].group(t, group)
		if g == nil {
			out[i] = [2]int{-1, -1}
			continue
		}
		out[i] = [2]int{int(g.GetSpec().GetSize()), int(g.GetActualSize())}
	}
	return out
}

// TestPoolSync: a MachinePool of 5 over two shards becomes shard groups of 3
// and 2, server groups of 3 and 2 instances, and a ready pool listing 5
// provider IDs; scaling to 1 and deleting the pool follow through to the
// servers and release every finalizer.
func TestPoolSync(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)

	f.createPool(t, "workers", 5, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		a, okA := get(t, f.ns, "workers--shard-a", &infrav1.NstanceShardGroup{})
		b, okB := get(t, f.ns, "workers--shard-b", &infrav1.NstanceShardGroup{})
		return okA && okB && a.Spec.Size == 3 && b.Spec.Size == 2
	}, waitLong, tick)
	sg, ok := get(t, f.ns, "workers--shard-a", &infrav1.NstanceShardGroup{})
	require.True(t, ok)
	ref := metav1.GetControllerOf(sg)
	require.NotNil(t, ref)
	require.Equal(t, "workers", ref.Name)

	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "workers", "shard-a", "shard-b"), [][2]int{{3, 3}, {2, 2}})
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		sg, _ = get(t, f.ns, "workers--shard-a", &infrav1.NstanceShardGroup{})
		return slices.Contains(sg.Finalizers, infrav1.ShardGroupFinalizer)
	}, waitLong, tick)
	pool0, _ := get(t, f.ns, "workers", &infrav1.NstanceMachinePool{})
	require.Contains(t, pool0.Finalizers, infrav1.MachinePoolFinalizer)
	var pool *infrav1.NstanceMachinePool
	defer func() {
		if t.Failed() {
			t.Log(dump(t, f.ns, "workers")())
		}
	}()
	require.Eventually(t, func() bool {
		pool, _ = get(t, f.ns, "workers", &infrav1.NstanceMachinePool{})
		return len(pool.Spec.ProviderIDList) == 5 && pool.Status.Replicas == 5 && pool.Status.Ready &&
			condition(pool.Status.Conditions, infrav1.ReadyCondition) == metav1.ConditionTrue
	}, 20*time.Second, tick, "pool status")
	require.True(t, slices.IsSorted(pool.Spec.ProviderIDList))
	require.NotNil(t, pool.Status.Initialization.Provisioned)
	require.True(t, *pool.Status.Initialization.Provisioned)
	require.Equal(t, metav1.ConditionTrue, condition(pool.Status.Conditions, infrav1.ReadyCondition))
	var want []string
	for _, s := range []string{"shard-a", "shard-b"} {
		want = append(want, f.shards[s].group(t, "workers").GetProviderIds()...)
	}
	slices.Sort(want)
	require.Equal(t, want, pool.Spec.ProviderIDList, "pool lists exactly the servers' provider IDs")
	sg, _ = get(t, f.ns, "workers--shard-b", &infrav1.NstanceShardGroup{})
	require.Equal(t, metav1.ConditionTrue, condition(sg.Status.Conditions, infrav1.ShardReachableCondition))
	require.Equal(t, metav1.ConditionTrue, condition(sg.Status.Conditions, infrav1.ConfigValidCondition))
	require.NotNil(t, sg.Status.LastSyncTime)

	// NstanceCluster: one failure domain per shard.
	require.Eventually(t, func() bool {
		nc, ok := get(t, f.ns, clusterID, &infrav1.NstanceCluster{})
		return ok && len(nc.Status.FailureDomains) == 2 && nc.Status.FailureDomains[0].Name == "shard-a" && nc.Status.Ready
	}, waitLong, tick)

	// The kubeconfig Secret for CAPI holds a ServiceAccount token.
	var kc *corev1.Secret
	require.Eventually(t, func() bool {
		kc, ok = get(t, f.ns, clusterID+"-kubeconfig", &corev1.Secret{})
		return ok
	}, waitLong, tick)
	require.Equal(t, clusterv1.ClusterSecretType, kc.Type)
	kcfg, err := clientcmd.Load(kc.Data["value"])
	require.NoError(t, err)
	require.NotEmpty(t, kcfg.AuthInfos[kcfg.Contexts[kcfg.CurrentContext].AuthInfo].Token)

	// Paused: a replica change waits until the annotation goes away.
	setPaused(t, f.ns, "workers", true)
	f.scale(t, "workers", 2)
	time.Sleep(time.Second)
	sg, _ = get(t, f.ns, "workers--shard-a", &infrav1.NstanceShardGroup{})
	require.Equal(t, int32(3), sg.Spec.Size, "paused pool not resized")
	setPaused(t, f.ns, "workers", false)
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "workers", "shard-a", "shard-b"), [][2]int{{1, 1}, {1, 1}})
	}, waitLong, tick)

	// Scale to 1: shard groups 1 and 0, servers follow.
	f.scale(t, "workers", 1)
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "workers", "shard-a", "shard-b"), [][2]int{{1, 1}, {0, 0}})
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		pool, _ = get(t, f.ns, "workers", &infrav1.NstanceMachinePool{})
		return len(pool.Spec.ProviderIDList) == 1 && pool.Status.Replicas == 1 && pool.Status.Ready &&
			condition(pool.Status.Conditions, infrav1.ReadyCondition) == metav1.ConditionTrue
	}, waitLong, tick)

	// Delete: server groups go, finalizers are released, objects vanish.
	require.NoError(t, env.Client.Delete(context.Background(), pool))
	require.NoError(t, env.Client.Delete(context.Background(), &clusterv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "workers"}}))
	require.Eventually(t, func() bool {
		_, okPool := get(t, f.ns, "workers", &infrav1.NstanceMachinePool{})
		_, okA := get(t, f.ns, "workers--shard-a", &infrav1.NstanceShardGroup{})
		_, okB := get(t, f.ns, "workers--shard-b", &infrav1.NstanceShardGroup{})
		return !okPool && !okA && !okB
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "workers", "shard-a", "shard-b"), [][2]int{{-1, -1}, {-1, -1}})
	}, waitLong, tick)
}

// TestImportOnce: groups already on the servers become pools once; a
// deleted imported pool is not brought back, even after a restart while the
// server still lists the group.
func TestImportOnce(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	ctx := context.Background()
	upsert := func(shard, group string, size uint32) {
		_, err := f.shards[shard].client(t).UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
			GroupId: group, Template: "worker", Size: size,
		}})
		require.NoError(t, err)
	}
	upsert("shard-a", "legacy", 1)
	upsert("shard-b", "legacy", 2)
	upsert("shard-b", "solo", 1)

	r := startOperator(t, f.options(t))
	r.waitImported(t)
	require.Equal(t, []string{"legacy", "solo"}, r.op.ImportResult.Imported)

	legacy, ok := get(t, f.ns, "legacy", &infrav1.NstanceMachinePool{})
	require.True(t, ok)
	require.Equal(t, []string{"shard-b", "shard-a"}, legacy.Spec.Shards, "larger shard first keeps its remainder")
	require.Equal(t, "worker", legacy.Spec.Template)
	mp, ok := get(t, f.ns, "legacy", &clusterv1.MachinePool{})
	require.True(t, ok)
	require.Equal(t, int32(3), *mp.Spec.Replicas)
	require.Equal(t, "NstanceMachinePool", mp.Spec.Template.Spec.InfrastructureRef.Kind)
	solo, _ := get(t, f.ns, "solo", &clusterv1.MachinePool{})
	require.Equal(t, int32(1), *solo.Spec.Replicas)

	// The imported pool drives the servers with the same sizes.
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "legacy", "shard-a", "shard-b"), [][2]int{{1, 1}, {2, 2}})
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "legacy", &infrav1.NstanceMachinePool{})
		return p.Status.Ready && len(p.Spec.ProviderIDList) == 3
	}, waitLong, tick)

	// Delete the imported pool; it is not re-imported.
	require.NoError(t, env.Client.Delete(ctx, legacy))
	require.NoError(t, env.Client.Delete(ctx, mp))
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, "legacy", &infrav1.NstanceMachinePool{})
		return !ok
	}, waitLong, tick)
	r.stop()

	// The group reappears on a server (say, still winding down); a restart
	// must not import it, nor import "solo" a second time.
	upsert("shard-a", "legacy", 1)
	r = startOperator(t, f.options(t))
	r.waitImported(t)
	require.Empty(t, r.op.ImportResult.Imported)
	require.Equal(t, 2, r.op.ImportResult.Known)
	_, ok = get(t, f.ns, "legacy", &infrav1.NstanceMachinePool{})
	require.False(t, ok, "deleted pool not re-imported")
}

// TestShardOutage: a stopped shard marks only its own shard group
// unreachable (with an Event) while the other shard keeps syncing; after a
// restart it resyncs. A provider error becomes an Event.
func TestShardOutage(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	o := f.options(t)
	reg := prometheus.NewRegistry()
	o.MetricsRegistry = reg
	r := startOperator(t, o)
	r.waitImported(t)
	f.createPool(t, "web", 4, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "web", "shard-a", "shard-b"), [][2]int{{2, 2}, {2, 2}})
	}, waitLong, tick)

	f.shards["shard-b"].stop()
	require.Eventually(t, func() bool {
		sg, _ := get(t, f.ns, "web--shard-b", &infrav1.NstanceShardGroup{})
		return condition(sg.Status.Conditions, infrav1.ShardReachableCondition) == metav1.ConditionFalse
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceShardGroup", "web--shard-b", "ShardUnreachable")) > 0
	}, waitLong, tick)
	require.Equal(t, []string{"shard-b"}, r.op.Conns.Down(), "the down shard is reported")
	// Shard a's group stays reachable (its status may land after the
	// server already shows the sizes: wait for it, then it must hold).
	require.Eventually(t, func() bool {
		sgA, ok := get(t, f.ns, "web--shard-a", &infrav1.NstanceShardGroup{})
		return ok && condition(sgA.Status.Conditions, infrav1.ShardReachableCondition) == metav1.ConditionTrue
	}, waitLong, tick)

	// Shard a keeps syncing while b is down.
	f.scale(t, "web", 6)
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "web", "shard-a"), [][2]int{{3, 3}})
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "web", &infrav1.NstanceMachinePool{})
		// ready (provisioned for core CAPI) latches; convergence is the
		// Ready condition.
		return p.Status.Ready && condition(p.Status.Conditions, infrav1.ReadyCondition) == metav1.ConditionFalse
	}, waitLong, tick)

	// Restart b: it reconnects, resyncs and catches up.
	f.shards["shard-b"].restart()
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "web", "shard-b"), [][2]int{{3, 3}})
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		sg, _ := get(t, f.ns, "web--shard-b", &infrav1.NstanceShardGroup{})
		p, _ := get(t, f.ns, "web", &infrav1.NstanceMachinePool{})
		return condition(sg.Status.Conditions, infrav1.ShardReachableCondition) == metav1.ConditionTrue &&
			condition(p.Status.Conditions, infrav1.ReadyCondition) == metav1.ConditionTrue && len(p.Spec.ProviderIDList) == 6
	}, waitLong, tick)

	require.Empty(t, r.op.Conns.Down())
	reconnects, err := testutil.GatherAndCount(reg, "nstance_operator_stream_reconnects_total")
	require.NoError(t, err)
	require.Positive(t, reconnects, "stream reconnects counted")
	up, err := testutil.GatherAndCount(reg, "nstance_operator_shard_up")
	require.NoError(t, err)
	require.Equal(t, 2, up)
	syncs, err := testutil.GatherAndCount(reg, "nstance_operator_group_sync_duration_seconds")
	require.NoError(t, err)
	require.Positive(t, syncs)

	// A provider error on shard a becomes an Event on its shard group.
	prov := f.shards["shard-a"].sh.Provider.(*mock.Provider)
	prov.FailCreate(func(provider.CreateRequest) error { return fmt.Errorf("quota exceeded for test.small") })
	f.scale(t, "web", 8)
	require.Eventually(t, func() bool {
		for _, n := range f.events(t, "NstanceShardGroup", "web--shard-a", "ProviderError") {
			if containsAll(n, "shard-a", "quota exceeded") {
				return true
			}
		}
		return false
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceMachinePool", "web", "ProviderError")) > 0
	}, waitLong, tick)
}

func setPaused(t testing.TB, ns, name string, on bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var p infrav1.NstanceMachinePool
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return false
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		if on {
			p.Annotations[clusterv1.PausedAnnotation] = ""
		} else {
			delete(p.Annotations, clusterv1.PausedAnnotation)
		}
		return env.Client.Update(context.Background(), &p) == nil
	}, 10*time.Second, tick)
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !contains(s, p) {
			return false
		}
	}
	return true
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

func dump(t testing.TB, ns, pool string) func() string {
	return func() string {
		p, _ := get(t, ns, pool, &infrav1.NstanceMachinePool{})
		out := fmt.Sprintf("pool spec=%+v status=%+v", p.Spec, p.Status)
		var list infrav1.NstanceShardGroupList
		_ = env.Client.List(context.Background(), &list, client.InNamespace(ns))
		for _, sg := range list.Items {
			out += fmt.Sprintf("\n%s gen=%d spec=%+v status=%+v", sg.Name, sg.Generation, sg.Spec, sg.Status)
		}
		return out
	}
}

// TestPoolBeingDeletedNotReimported: a pool whose deletion waits on a down
// shard is still being deleted when the operator restarts and finds the
// group on that shard; the import leaves it alone (even without the ledger)
// and the deletion completes.
func TestPoolBeingDeletedNotReimported(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	ctx := context.Background()
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	f.createPool(t, "gone", 2, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "gone", "shard-a", "shard-b"), [][2]int{{1, 1}, {1, 1}})
	}, waitLong, tick)

	f.shards["shard-b"].stop()
	pool, _ := get(t, f.ns, "gone", &infrav1.NstanceMachinePool{})
	require.NoError(t, env.Client.Delete(ctx, pool))
	require.Eventually(t, func() bool {
		_, okA := get(t, f.ns, "gone--shard-a", &infrav1.NstanceShardGroup{})
		sgB, okB := get(t, f.ns, "gone--shard-b", &infrav1.NstanceShardGroup{})
		return !okA && okB && !sgB.DeletionTimestamp.IsZero()
	}, waitLong, tick, "shard-a part deleted, shard-b part held by its finalizer")
	r.stop()

	// Drop the ledger too: the pool's own deletionTimestamp must suffice.
	require.NoError(t, env.Client.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "nstance-operator-groups"}}))
	f.shards["shard-b"].restart()
	require.NotNil(t, f.shards["shard-b"].group(t, "gone"), "group still on shard-b")

	r = startOperator(t, f.options(t))
	r.waitImported(t)
	require.Empty(t, r.op.ImportResult.Imported)
	require.Eventually(t, func() bool {
		_, okPool := get(t, f.ns, "gone", &infrav1.NstanceMachinePool{})
		return !okPool && f.shards["shard-b"].group(t, "gone") == nil
	}, waitLong, tick, "deletion completes on the recovered shard")
	_, ok := get(t, f.ns, "gone", &infrav1.NstanceMachinePool{})
	require.False(t, ok)
}
