package capicontract_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	"github.com/nstance-dev/nstance/internal/operator/ondemand"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// moveKinds are the kinds clusterctl move would discover in the namespace:
// the Cluster API and Nstance kinds, Secrets and ConfigMaps.
var moveKinds = []schema.GroupVersionKind{
	clusterv1.GroupVersion.WithKind("Cluster"),
	clusterv1.GroupVersion.WithKind("Machine"),
	clusterv1.GroupVersion.WithKind("MachinePool"),
	cpv1.GroupVersion.WithKind("NstanceControlPlane"),
	infrav1.GroupVersion.WithKind("NstanceCluster"),
	infrav1.GroupVersion.WithKind("NstanceMachine"),
	infrav1.GroupVersion.WithKind("NstanceMachinePool"),
	infrav1.GroupVersion.WithKind("NstanceShardGroup"),
	infrav1.GroupVersion.WithKind("NstanceMachineTemplate"),
	corev1.SchemeGroupVersion.WithKind("Secret"),
	corev1.SchemeGroupVersion.WithKind("ConfigMap"),
}

// discoverMove lists what clusterctl move would move out of ns, by its
// object graph rules (cmd/clusterctl/client/cluster/objectgraph.go): every
// Cluster and what hangs off it through owner references, Secrets named
// after a Cluster that have no owner, and objects with the move label. The
// result is in creation order (owners first). left are the objects of those
// kinds it would leave behind.
func discoverMove(t *testing.T, ns string) (moved, left []*unstructured.Unstructured) {
	t.Helper()
	var all []*unstructured.Unstructured
	for _, gvk := range moveKinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		require.NoError(t, env.Client.List(context.Background(), list, client.InNamespace(ns)))
		for i := range list.Items {
			all = append(all, &list.Items[i])
		}
	}
	clusters := map[string]bool{}
	for _, o := range all {
		if o.GetKind() == "Cluster" {
			clusters[o.GetName()] = true
		}
	}
	in := map[types.UID]bool{}
	for _, o := range all {
		_, labelled := o.GetLabels()[clusterctlv1.ClusterctlMoveLabel]
		soft := false
		if o.GetKind() == "Secret" && len(o.GetOwnerReferences()) == 0 {
			for c := range clusters {
				soft = soft || strings.HasPrefix(o.GetName(), c+"-")
			}
		}
		if o.GetKind() == "Cluster" || labelled || soft {
			in[o.GetUID()] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for _, o := range all {
			if in[o.GetUID()] {
				continue
			}
			for _, ref := range o.GetOwnerReferences() {
				if in[ref.UID] {
					in[o.GetUID()], changed = true, true
					break
				}
			}
		}
	}
	// Owners first: an object comes after every moved object it names.
	placed := map[types.UID]bool{}
	for len(moved) < len(in) {
		progress := false
		for _, o := range all {
			if !in[o.GetUID()] || placed[o.GetUID()] {
				continue
			}
			ready := true
			for _, ref := range o.GetOwnerReferences() {
				ready = ready && (!in[ref.UID] || placed[ref.UID])
			}
			if ready {
				moved, placed[o.GetUID()], progress = append(moved, o), true, true
			}
		}
		require.True(t, progress, "owner reference cycle")
	}
	for _, o := range all {
		if !in[o.GetUID()] {
			left = append(left, o)
		}
	}
	return moved, left
}

// lazy formats a failure message only when it is printed.
type lazy func() string

func (l lazy) String() string { return l() }

func kindName(o client.Object) string {
	return o.GetObjectKind().GroupVersionKind().Kind + "/" + o.GetName()
}

// simulateMove does what clusterctl move does to the objects of a paused
// Cluster, within one API server: it deletes them (finalizers removed
// first, dependents first) and creates them again from what was read,
// owners first, with new UIDs in the owner references and without status.
// The recreated Cluster is still paused.
func simulateMove(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, kubetest.MoveAway(ctx, env.Client, objs, waitLong))
	require.NoError(t, kubetest.MoveIn(ctx, env.Client, objs, false))
}

func setClusterPaused(t *testing.T, ns string, on bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var c clusterv1.Cluster
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: clusterID}, &c); err != nil {
			return false
		}
		c.Spec.Paused = ptr.To(on)
		return env.Client.Update(context.Background(), &c) == nil
	}, waitLong, tick)
}

// nstanceObjects returns the operator's infrastructure objects in ns, all
// of which carry a Paused condition.
func nstanceObjects(t *testing.T, ns string) []conditionedObject {
	t.Helper()
	ctx := context.Background()
	var out []conditionedObject
	var nms infrav1.NstanceMachineList
	require.NoError(t, env.Client.List(ctx, &nms, client.InNamespace(ns)))
	for i := range nms.Items {
		out = append(out, &nms.Items[i])
	}
	var pools infrav1.NstanceMachinePoolList
	require.NoError(t, env.Client.List(ctx, &pools, client.InNamespace(ns)))
	for i := range pools.Items {
		out = append(out, &pools.Items[i])
	}
	var sgs infrav1.NstanceShardGroupList
	require.NoError(t, env.Client.List(ctx, &sgs, client.InNamespace(ns)))
	for i := range sgs.Items {
		out = append(out, &sgs.Items[i])
	}
	var ncs infrav1.NstanceClusterList
	require.NoError(t, env.Client.List(ctx, &ncs, client.InNamespace(ns)))
	for i := range ncs.Items {
		out = append(out, &ncs.Items[i])
	}
	var cps cpv1.NstanceControlPlaneList
	require.NoError(t, env.Client.List(ctx, &cps, client.InNamespace(ns)))
	for i := range cps.Items {
		out = append(out, &cps.Items[i])
	}
	return out
}

type conditionedObject interface {
	client.Object
	GetConditions() []metav1.Condition
}

// waitPausedCondition waits until every operator object in ns reports the
// Paused condition with status want.
func waitPausedCondition(t *testing.T, ns string, want bool, within time.Duration) {
	t.Helper()
	var pending []string
	require.Eventually(t, func() bool {
		pending = nil
		for _, o := range nstanceObjects(t, ns) {
			if conditions.IsTrue(o, clusterv1.PausedCondition) != want || !conditions.Has(o, clusterv1.PausedCondition) {
				pending = append(pending, fmt.Sprintf("%T/%s", o, o.GetName()))
			}
		}
		return len(pending) == 0
	}, within, tick, "Paused=%v on every operator object; pending: %v", want, &pending)
}

func waitClusterProvisioned(t *testing.T, ns string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var c clusterv1.Cluster
		return get(t, client.ObjectKey{Namespace: ns, Name: clusterID}, &c) &&
			ptr.Deref(c.Status.Initialization.InfrastructureProvisioned, false) &&
			ptr.Deref(c.Status.Initialization.ControlPlaneInitialized, false)
	}, waitLong, tick, "core CAPI marks the Cluster provisioned")
}

func shardInstances(t *testing.T, f *fixture) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.shard.Client(t, tenant).ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	require.NoError(t, err)
	var ids []string
	for _, i := range resp.GetInstances() {
		ids = append(ids, i.GetInstanceId())
	}
	slices.Sort(ids)
	return ids
}

// TestClusterctlMove moves a running cluster the way clusterctl move does
// (pause, delete with finalizers removed, recreate without status and
// paused, unpause) and checks that every NstanceMachine adopts its
// instance from spec: no instance is created or deleted, and Machines,
// NstanceMachines and the MachinePool keep their provider IDs. Everything
// the operator created is found by clusterctl's discovery rules.
func TestClusterctlMove(t *testing.T) {
	f := newFixture(t)
	bindCAPIWorkloadRole(t, f.ns)
	startOperator(t, f.opts)
	logs := &capiLog{}
	startCAPI(t, f.ns, logs.logger())
	t.Cleanup(func() {
		if t.Failed() {
			for _, line := range logs.matching("rror") {
				t.Log(line)
			}
		}
	})
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: f.ns, Name: name} }
	waitClusterProvisioned(t, f.ns)

	f.createPool(t, "solo", 0, 30*time.Second)
	f.createPool(t, "workers", 2, 100*time.Millisecond)
	type before struct{ providerID, instanceID, shard string }
	machines := map[string]before{}
	for _, name := range []string{"mv-1", "mv-2"} {
		_, nm := f.createMachine(t, name)
		require.Equal(t, nm.Status.InstanceID, nm.Spec.InstanceID, "the instance is named in spec")
		require.Equal(t, shardID, nm.Spec.Shard)
		require.NotEmpty(t, nm.Annotations[machine.CreateNonceAnnotation])
		machines[name] = before{nm.Spec.ProviderID, nm.Spec.InstanceID, nm.Spec.Shard}
	}
	var mp clusterv1.MachinePool
	require.Eventually(t, func() bool {
		return get(t, key("workers"), &mp) && ptr.Deref(mp.Status.Replicas, 0) == 2 && len(mp.Spec.ProviderIDList) == 2 &&
			len(mp.Status.NodeRefs) == 2
	}, waitLong, tick, "the MachinePool runs two instances")
	poolIDs := slices.Sorted(slices.Values(mp.Spec.ProviderIDList))
	instances := shardInstances(t, f)
	require.Len(t, instances, 4)
	creates, deletes := f.provider.Counts()

	// Source side: pause, wait until nothing reconciles, then take
	// everything clusterctl would move.
	setClusterPaused(t, f.ns, true)
	waitPausedCondition(t, f.ns, true, waitLong)
	objs, left := discoverMove(t, f.ns)
	var names []string
	for _, o := range objs {
		names = append(names, kindName(o))
	}
	for _, o := range nstanceObjects(t, f.ns) {
		require.Contains(t, names, fmt.Sprintf("%s/%s", strings.TrimPrefix(fmt.Sprintf("%T", o), "*v1beta1."), o.GetName()),
			"clusterctl move finds every operator object")
	}
	require.Contains(t, names, "Secret/"+clusterID+"-kubeconfig")
	require.Contains(t, names, "ConfigMap/nstance-operator-groups", "the ledger carries the move label")
	// Only the operator's own registration (its credentials, the cluster
	// CA) and the API server's root CA stay behind.
	stay := []string{"ConfigMap/" + opconfig.DefaultCAConfigMap, "ConfigMap/kube-root-ca.crt", "Secret/" + opconfig.DefaultNonceSecret,
		"Secret/" + opconfig.DefaultCertSecret, "Secret/" + opconfig.DefaultKeySecret}
	for _, o := range left {
		require.Contains(t, stay, kindName(o), "clusterctl move would leave %s behind", kindName(o))
	}

	simulateMove(t, objs)
	// The recreated objects get their Paused condition and nothing else.
	waitPausedCondition(t, f.ns, true, waitLong)
	for name := range machines {
		var nm infrav1.NstanceMachine
		require.True(t, get(t, key(name), &nm))
		require.Empty(t, nm.Status.InstanceID, "a paused NstanceMachine is not reconciled")
	}

	setClusterPaused(t, f.ns, false)
	waitPausedCondition(t, f.ns, false, waitLong)
	for name, b := range machines {
		var nm infrav1.NstanceMachine
		require.Eventually(t, func() bool {
			return get(t, key(name), &nm) && nm.Status.Ready && nm.Status.InstanceID == b.instanceID
		}, waitLong, tick, "NstanceMachine %s adopts instance %s", name, b.instanceID)
		require.Equal(t, b.providerID, nm.Spec.ProviderID)
		require.Equal(t, b.instanceID, nm.Spec.InstanceID)
		require.Equal(t, b.shard, nm.Status.Shard)
		require.True(t, conditions.IsTrue(&nm, machine.ConditionInstanceCreated))
		var m clusterv1.Machine
		require.Eventually(t, func() bool {
			return get(t, key(name), &m) && ptr.Deref(m.Status.Initialization.InfrastructureProvisioned, false)
		}, waitLong, tick, "core CAPI sees Machine %s's infrastructure provisioned again", name)
		require.Equal(t, b.providerID, m.Spec.ProviderID)
		// Running and Ready need core CAPI's connection to the workload
		// cluster of the recreated Cluster; its Machine controller retries
		// with exponential backoff until then, which can take longer than
		// the operator's part.
		require.Eventually(t, func() bool {
			return get(t, key(name), &m) && m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.Status.NodeRef.IsDefined() &&
				conditions.IsTrue(&m, clusterv1.MachineReadyCondition)
		}, drainWait, tick, "core CAPI reports Machine %s Running and Ready again: %v", name, lazy(func() string {
			return fmt.Sprintf("phase=%s nodeRef=%v conditions=%+v", m.Status.Phase, m.Status.NodeRef, m.Status.Conditions)
		}))
		require.Equal(t, b.providerID, m.Spec.ProviderID)
	}
	require.Eventually(t, func() bool {
		return get(t, key("workers"), &mp) && ptr.Deref(mp.Status.Replicas, 0) == 2 && len(mp.Status.NodeRefs) == 2 &&
			ptr.Deref(mp.Status.Initialization.InfrastructureProvisioned, false)
	}, waitLong, tick, "core CAPI reports the moved MachinePool with two replicas")
	require.Equal(t, poolIDs, slices.Sorted(slices.Values(mp.Spec.ProviderIDList)), "same provider IDs in the pool")

	require.Equal(t, instances, shardInstances(t, f), "no instance created or removed on the shard")
	c, d := f.provider.Counts()
	require.Equal(t, creates, c, "no VM created")
	require.Equal(t, deletes, d, "no VM deleted")
}

// resourceVersions maps every object in objs (and the Nodes named nodes)
// to its current resourceVersion; an object that is gone maps to "".
func resourceVersions(t *testing.T, objs []*unstructured.Unstructured, nodes ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objs {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(o.GroupVersionKind())
		if get(t, client.ObjectKeyFromObject(o), cur) {
			out[kindName(o)] = cur.GetResourceVersion()
		} else {
			out[kindName(o)] = ""
		}
	}
	for _, node := range nodes {
		var n corev1.Node
		if get(t, client.ObjectKey{Name: node}, &n) {
			out["Node/"+node] = n.ResourceVersion
		}
	}
	return out
}

// TestPauseStopsWrites pauses the Cluster and then does what normally makes
// the operator write: a MachinePool and an NstanceMachinePool spec change,
// an annotated on-demand pod, and server-side deletions that stream
// instance and group events (one of them of a standalone Machine's instance
// with a pod on its Node, whose drain deadline passes while paused). For
// several reconcile periods no object of the cluster the operator writes
// (nor any Node, nor the pod) changes its resourceVersion, and no pod is
// evicted. Unpaused, the writes follow at once.
func TestPauseStopsWrites(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	bindCAPIWorkloadRole(t, f.ns)
	startOperator(t, f.opts)
	logs := &capiLog{}
	startCAPI(t, f.ns, logs.logger())
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: f.ns, Name: name} }
	waitClusterProvisioned(t, f.ns)

	// A short drain deadline: the server deletes the paused Machine's
	// instance while the operator may not drain it.
	f.createPool(t, "solo", 0, time.Second)
	f.createPool(t, "workers", 2, 100*time.Millisecond)
	m, nm := f.createMachine(t, "pz-1")
	node, ok := nodeByProviderID(t, nm.Spec.ProviderID)
	require.True(t, ok)
	createPod(t, f.ns, "app", node.Name, nil)
	var mp clusterv1.MachinePool
	require.Eventually(t, func() bool {
		return get(t, key("workers"), &mp) && ptr.Deref(mp.Status.Replicas, 0) == 2 && len(mp.Spec.ProviderIDList) == 2
	}, waitLong, tick, "the MachinePool runs two instances")

	setClusterPaused(t, f.ns, true)
	waitPausedCondition(t, f.ns, true, waitLong)
	// Core CAPI records its own Paused condition on every Machine and
	// MachinePool (a write the snapshot must not see later).
	require.Eventually(t, func() bool {
		var ms clusterv1.MachineList
		var mps clusterv1.MachinePoolList
		require.NoError(t, env.Client.List(ctx, &ms, client.InNamespace(f.ns)))
		require.NoError(t, env.Client.List(ctx, &mps, client.InNamespace(f.ns)))
		for i := range ms.Items {
			if !conditions.IsTrue(&ms.Items[i], clusterv1.PausedCondition) {
				return false
			}
		}
		for i := range mps.Items {
			if !conditions.IsTrue(&mps.Items[i], clusterv1.PausedCondition) {
				return false
			}
		}
		return len(ms.Items) > 0 && len(mps.Items) > 0
	}, waitLong, tick, "core CAPI pauses too")
	objs, _ := discoverMove(t, f.ns)
	// The Cluster and the MachinePools are written by core CAPI and the
	// test only; everything else of the cluster is the operator's to write.
	objs = slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "Cluster" || o.GetKind() == "MachinePool"
	})
	var nodeList corev1.NodeList
	require.NoError(t, env.Client.List(ctx, &nodeList))
	var nodes []string
	for _, n := range nodeList.Items {
		nodes = append(nodes, n.Name)
	}
	want := resourceVersions(t, objs, nodes...)

	// Normally: shard groups resized and re-specced, pool status updated.
	require.True(t, get(t, key("workers"), &mp))
	mpPatch := client.MergeFrom(mp.DeepCopy())
	mp.Spec.Replicas = ptr.To[int32](3)
	require.NoError(t, env.Client.Patch(ctx, &mp, mpPatch))
	var pool infrav1.NstanceMachinePool
	require.True(t, get(t, key("workers"), &pool))
	poolPatch := client.MergeFrom(pool.DeepCopy())
	pool.Spec.Vars = map[string]string{"moved": "no"}
	require.NoError(t, env.Client.Patch(ctx, &pool, poolPatch))
	want["NstanceMachinePool/workers"] = pool.ResourceVersion
	// Normally: the pod gets a finalizer, a Machine and an NstanceMachine.
	burst := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "burst", Annotations: map[string]string{ondemand.AnnotationGroup: "solo"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}}},
	}
	require.NoError(t, env.Client.Create(ctx, burst))
	// Operators of later tests watch pods of every namespace: the pod must
	// not outlive this test (its finalizer is gone once removed here).
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), burst)
		_ = env.Client.Patch(context.Background(), burst, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	})
	want["Pod/burst"] = burst.ResourceVersion
	podRV := func() string {
		var p corev1.Pod
		if !get(t, client.ObjectKeyFromObject(burst), &p) {
			return ""
		}
		return p.ResourceVersion
	}
	// Normally: the shard group's status follows the replacement.
	poolInstance := ""
	for _, id := range shardInstances(t, f) {
		if id != nm.Spec.InstanceID {
			poolInstance = id
			break
		}
	}
	require.NotEmpty(t, poolInstance)
	cl := f.shard.Client(t, tenant)
	_, err := cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: poolInstance})
	require.NoError(t, err)
	// Normally: the Node is cordoned and drained, the NstanceMachine
	// reports the drain, and once the instance is gone its Machine goes.
	resp, err := cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: nm.Spec.InstanceID})
	require.NoError(t, err)
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, resp.GetInstance().GetState())

	current := func() map[string]string {
		got := resourceVersions(t, objs, nodes...)
		got["Pod/burst"] = podRV()
		return got
	}
	unchanged := func(d time.Duration) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(tick) {
			require.Equal(t, want, current(), "a paused cluster's objects are not written")
		}
	}
	// The server deletes the instance at its drain deadline, unacknowledged.
	require.Eventually(t, func() bool {
		require.Equal(t, want, current(), "a paused cluster's objects are not written")
		return instanceState(t, f.shard, nm.Spec.InstanceID) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
	}, waitLong, tick, "the server deletes the undrained instance at its deadline")
	// Many reconcile periods (poll and retry intervals are 100-300ms).
	unchanged(3 * time.Second)
	require.True(t, podExists(t, f.ns, "app"), "no eviction while paused")
	require.False(t, get(t, key(ondemand.Name(burst)), &clusterv1.Machine{}), "no on-demand Machine while paused")
	var n corev1.Node
	require.True(t, get(t, client.ObjectKey{Name: node.Name}, &n))
	require.False(t, n.Spec.Unschedulable, "no cordon while paused")

	// Unpaused, everything happens without waiting for a resync (the
	// manager's is hours).
	setClusterPaused(t, f.ns, false)
	const prompt = 15 * time.Second
	waitPausedCondition(t, f.ns, false, prompt)
	require.Eventually(t, func() bool {
		var sg infrav1.NstanceShardGroup
		return get(t, key(infrav1.ShardGroupName("workers", shardID)), &sg) && sg.Spec.Size == 3 && sg.Spec.Vars["moved"] == "no"
	}, prompt, tick, "the pool resizes and re-specs its shard group")
	require.Eventually(t, func() bool {
		return !get(t, key(m.Name), &clusterv1.Machine{}) && !get(t, key(m.Name), &infrav1.NstanceMachine{})
	}, prompt, tick, "the Machine of the deleted instance goes")
	require.Eventually(t, func() bool {
		return get(t, key(ondemand.Name(burst)), &clusterv1.Machine{}) && get(t, key(ondemand.Name(burst)), &infrav1.NstanceMachine{})
	}, prompt, tick, "the on-demand pod gets its Machine")
	require.Eventually(t, func() bool {
		return get(t, key("workers"), &pool) && pool.Status.Replicas == 3 && pool.Status.ObservedGeneration == pool.Generation
	}, waitLong, tick, "the pool reports three replicas")
}
