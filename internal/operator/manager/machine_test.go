package manager_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	"github.com/nstance-dev/nstance/internal/operator/ondemand"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// machinePair creates a Machine and its NstanceMachine, owned as core
// Cluster API would own it.
func (f *fixture) machinePair(t testing.TB, name, group, failureDomain string) {
	t.Helper()
	ctx := context.Background()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec: clusterv1.MachineSpec{ClusterName: clusterID, FailureDomain: failureDomain,
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To("")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: name}},
	}
	require.NoError(t, env.Client.Create(ctx, m))
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: name, UID: m.UID}}},
		Spec: infrav1.NstanceMachineSpec{Group: group},
	}))
}

func (f *fixture) waitGroupOnShards(t testing.TB, group string, shards ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, s := range shards {
			if f.shards[s].group(t, group) == nil {
				return false
			}
		}
		return true
	}, waitLong, tick)
}

func waitMachineRunning(t testing.TB, ns, name string) *infrav1.NstanceMachine {
	t.Helper()
	var nm *infrav1.NstanceMachine
	require.Eventually(t, func() bool {
		got, ok := get(t, ns, name, &infrav1.NstanceMachine{})
		nm = got
		return ok && got.Status.Ready && got.Spec.ProviderID != ""
	}, waitLong, tick)
	return nm
}

// deleteOnServer starts the deletion of an instance through its shard, as
// an administrator would. With no Node to drain the operator acknowledges
// the drain at once, so by the time the server answers the instance may
// already be deleting: any state of a started deletion is fine.
func deleteOnServer(t testing.TB, f *fakeShard, id string) {
	t.Helper()
	resp, err := f.client(t).DeleteInstance(context.Background(), &nstancev1.DeleteInstanceRequest{InstanceId: id})
	require.NoError(t, err)
	require.Contains(t, []nstancev1.InstanceState{nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION,
		nstancev1.InstanceState_INSTANCE_STATE_DELETING, nstancev1.InstanceState_INSTANCE_STATE_DELETED}, resp.GetInstance().GetState())
}

func TestMachineLifecycle(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	o := f.options(t)
	o.DrainRetryInterval, o.MachinePollInterval = 100*time.Millisecond, 100*time.Millisecond
	r := startOperator(t, o)
	r.waitImported(t)
	f.createPool(t, "solo", 0, "shard-a", "shard-b")
	f.waitGroupOnShards(t, "solo", "shard-a", "shard-b")

	tests := []struct {
		name          string
		failureDomain string
		wantShard     string
		// serverSide deletes the instance through the shard instead of
		// deleting the NstanceMachine.
		serverSide bool
	}{
		{name: "failure domain picks the shard", failureDomain: "shard-b", wantShard: "shard-b"},
		{name: "no failure domain: first shard", failureDomain: "", wantShard: "shard-a"},
		{name: "deleted on the server: Machine cleaned up", failureDomain: "shard-b", wantShard: "shard-b", serverSide: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := []string{"m-fd", "m-default", "m-server"}[i]
			f.machinePair(t, name, "solo", tc.failureDomain)
			nm := waitMachineRunning(t, f.ns, name)
			require.Equal(t, tc.wantShard, nm.Status.Shard)
			require.Equal(t, tc.wantShard, nm.Status.FailureDomain)
			require.True(t, ptr.Deref(nm.Status.Initialization.Provisioned, false))
			require.NotEmpty(t, nm.Status.Addresses)
			require.Contains(t, nm.Finalizers, machine.Finalizer)
			sh := f.shards[tc.wantShard]
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, sh, nm.Status.InstanceID))
			resp, err := sh.client(t).GetInstanceStatus(context.Background(), &nstancev1.GetInstanceStatusRequest{
				Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: nm.Status.InstanceID}})
			require.NoError(t, err)
			require.Equal(t, resp.GetInstance().GetProviderId(), nm.Spec.ProviderID)

			if tc.serverSide {
				deleteOnServer(t, sh, nm.Status.InstanceID)
				require.Eventually(t, func() bool {
					_, ok := get(t, f.ns, name, &clusterv1.Machine{})
					return !ok
				}, waitLong, tick, "the drain coordinator deletes the Machine of a deleted instance")
				require.NoError(t, env.Client.Delete(context.Background(), nm))
			} else {
				require.NoError(t, env.Client.Delete(context.Background(), nm))
			}
			require.Eventually(t, func() bool {
				_, ok := get(t, f.ns, name, &infrav1.NstanceMachine{})
				return !ok
			}, waitLong, tick)
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, sh, nm.Status.InstanceID))
		})
	}
}

func TestOnDemandPod(t *testing.T) { forEachMode(t, testOnDemandPod) }

// testOnDemandPod: annotated pods in an allowed namespace of the workload
// cluster get a Machine and NstanceMachine in the operator's namespace, and
// with them an instance, when their pool opts in; a pod of another namespace
// gets a Warning Event and nothing else.
func testOnDemandPod(t *testing.T, m clusterMode) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	o := f.options(t)
	o.DrainRetryInterval, o.MachinePollInterval = 100*time.Millisecond, 100*time.Millisecond
	apps := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps-" + utilrand.String(6)}}
	o.Config.OnDemandNamespaces = []string{apps.Name}
	f.prepare(t, m, &o, true)
	r := startOperator(t, o)
	f.started(t, m)
	r.waitImported(t)
	f.createPool(t, "burst", 0, "shard-a", "shard-b")
	f.waitGroupOnShards(t, "burst", "shard-a", "shard-b")
	ctx := context.Background()
	pool, ok := get(t, f.ns, "burst", &infrav1.NstanceMachinePool{})
	require.True(t, ok)
	before := pool.DeepCopy()
	pool.Spec.OnDemand = &infrav1.OnDemandSpec{Enabled: true, AllowedInstanceTypes: []string{"test.small"}}
	require.NoError(t, env.Client.Patch(ctx, pool, client.MergeFrom(before)))
	require.NoError(t, m.wl.Create(ctx, apps))

	// A pod of a namespace that is not allowed: refused, with an Event.
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "other-"}}
	require.NoError(t, m.wl.Create(ctx, other))
	refused := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: other.Name, Name: "refused", Annotations: map[string]string{ondemand.AnnotationGroup: "burst"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/job"}}},
	}
	require.NoError(t, m.wl.Create(ctx, refused))
	require.Eventually(t, func() bool {
		var evs corev1.EventList
		require.NoError(t, m.wl.List(ctx, &evs, client.InNamespace(other.Name)))
		for _, ev := range evs.Items {
			if ev.InvolvedObject.UID == refused.UID && ev.Reason == ondemand.ReasonRefused && ev.Type == corev1.EventTypeWarning {
				return true
			}
		}
		return false
	}, waitLong, tick, "a refused pod gets a Warning Event")
	_, ok = get(t, f.ns, ondemand.Name(refused), &infrav1.NstanceMachine{})
	require.False(t, ok, "no NstanceMachine for a pod of a namespace that is not allowed")
	var decoy *corev1.Pod
	if m.management() {
		// An annotated pod in A, the management cluster: not the workload
		// cluster's, so it gets nothing.
		ensureNamespace(t, env.Client, apps.Name)
		decoy = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: apps.Name, Name: "decoy", Annotations: map[string]string{ondemand.AnnotationGroup: "burst"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/job"}}},
		}
		require.NoError(t, env.Client.Create(ctx, decoy))
	}

	tests := []struct {
		name        string
		annotations map[string]string
		wantShard   string
	}{
		{"group only", map[string]string{ondemand.AnnotationGroup: "burst"}, "shard-a"},
		{"group, instance type and shard", map[string]string{ondemand.AnnotationGroup: "burst",
			ondemand.AnnotationInstanceType: "test.small", ondemand.AnnotationShard: "shard-b"}, "shard-b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: apps.Name, GenerateName: "job-", Annotations: tc.annotations},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/job"}}},
			}
			require.NoError(t, m.wl.Create(ctx, pod))
			name := ondemand.Name(pod)
			var machine *clusterv1.Machine
			require.Eventually(t, func() bool {
				got, ok := get(t, f.ns, name, &clusterv1.Machine{})
				machine = got
				return ok
			}, waitLong, tick)
			require.Equal(t, clusterID, machine.Spec.ClusterName)
			require.NotNil(t, machine.Spec.Bootstrap.DataSecretName)
			require.Equal(t, clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: name}, machine.Spec.InfrastructureRef)
			require.Equal(t, tc.wantShard, machine.Spec.FailureDomain)
			if m.management() {
				require.Empty(t, machine.OwnerReferences, "a pod of another cluster owns nothing here")
			}
			nm := waitMachineRunning(t, f.ns, name)
			require.Equal(t, tc.wantShard, nm.Status.Shard)
			require.Equal(t, tc.annotations[ondemand.AnnotationInstanceType], nm.Spec.InstanceType)
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shards[tc.wantShard], nm.Status.InstanceID))
			got, ok := getIn(t, m.wl, pod.Namespace, pod.Name, &corev1.Pod{})
			require.True(t, ok)
			require.Contains(t, got.Finalizers, ondemand.Finalizer)

			require.NoError(t, m.wl.Delete(ctx, pod))
			require.Eventually(t, func() bool {
				_, podOK := getIn(t, m.wl, pod.Namespace, pod.Name, &corev1.Pod{})
				_, mOK := get(t, f.ns, name, &clusterv1.Machine{})
				_, nmOK := get(t, f.ns, name, &infrav1.NstanceMachine{})
				return !podOK && !mOK && !nmOK
			}, waitLong, tick)
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, f.shards[tc.wantShard], nm.Status.InstanceID))
		})
	}
	if decoy != nil {
		// The workload cluster's pods were served meanwhile; the pod in A
		// was never looked at.
		got, ok := get(t, decoy.Namespace, decoy.Name, &corev1.Pod{})
		require.True(t, ok)
		require.NotContains(t, got.Finalizers, ondemand.Finalizer)
		_, ok = get(t, f.ns, ondemand.Name(got), &clusterv1.Machine{})
		require.False(t, ok, "no Machine for a pod of the management cluster")
	}
}
