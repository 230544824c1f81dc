package capicontract_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/controlplane"
	"github.com/nstance-dev/nstance/internal/operator/drain"
	"github.com/nstance-dev/nstance/internal/operator/ondemand"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestManagementCluster runs the operator and core Cluster API in cluster A
// while the instances' Nodes and the pods live in workload cluster B, a
// second API server reached through the <cluster>-kubeconfig Secret in A
// (--workload-cluster=management). Core CAPI finds the Nodes in B; an
// instance deleted on the server is drained in B (a PodDisruptionBudget in
// B honoured) and nothing is cordoned or evicted in A; a pod in B that asks
// for an instance gets one.
func TestManagementCluster(t *testing.T) {
	ctx := context.Background()
	b := clusterB.Get(t)
	wl := b.Client
	f := newFixtureNodesIn(t, wl)
	require.NoError(t, wl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}))
	kubeconfig, err := os.ReadFile(b.Kubeconfig)
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: controlplane.KubeconfigSecretName(clusterID),
			Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": kubeconfig},
	}))
	a := &acks{ids: map[string]int{}}
	f.opts.OnDrainAcknowledged = a.record
	f.opts.WorkloadMode = workload.Management
	f.opts.WorkloadConnectRetry = 200 * time.Millisecond
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

	var cluster clusterv1.Cluster
	require.Eventually(t, func() bool {
		return get(t, key(clusterID), &cluster) && ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) &&
			conditions.IsTrue(&cluster, clusterv1.ClusterRemoteConnectionProbeCondition)
	}, waitLong, tick, "core CAPI connects to the workload cluster through the Secret")
	var secret corev1.Secret
	require.True(t, get(t, key(controlplane.KubeconfigSecretName(clusterID)), &secret))
	require.Equal(t, kubeconfig, secret.Data["value"], "in management mode the operator leaves the Secret alone")

	f.createPool(t, "solo", 0, 30*time.Second)

	t.Run("deleted on the server: drained in the workload cluster", func(t *testing.T) {
		m, nm := f.createMachine(t, "solo-1")
		instanceID := nm.Status.InstanceID
		node, ok := nodeIn(t, wl, nm.Spec.ProviderID)
		require.True(t, ok, "the Node is in B")
		require.Equal(t, node.Name, m.Status.NodeRef.Name, "core CAPI found it there")
		_, ok = nodeIn(t, env.Client, nm.Spec.ProviderID)
		require.False(t, ok, "no Node in A")
		podIn(t, wl, f.ns, "app", node.Name, nil)
		podIn(t, wl, f.ns, "guarded", node.Name, map[string]string{"app": "guarded"})
		require.NoError(t, wl.Create(ctx, &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "guarded"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
		}))
		pdbAllowedIn(t, wl, f.ns, "guarded", 0)

		_, err := f.shard.Client(t, tenant).DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: instanceID})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n corev1.Node
			return !exists(t, wl, key("app"), &corev1.Pod{}) && exists(t, wl, client.ObjectKey{Name: node.Name}, &n) &&
				n.Spec.Unschedulable && slices.Contains(nodeReasonsIn(t, wl, node.Name), drain.ReasonEvictionBlocked)
		}, waitLong, tick, "the operator cordons the Node in B, evicts the unguarded pod and reports the PDB")
		require.True(t, exists(t, wl, key("guarded"), &corev1.Pod{}), "the PDB in B holds the guarded pod")
		require.Zero(t, a.count(instanceID))
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, instanceState(t, f.shard, instanceID))

		pdbAllowedIn(t, wl, f.ns, "guarded", 1)
		require.Eventually(t, func() bool {
			_, ok := nodeIn(t, wl, nm.Spec.ProviderID)
			return !ok && !get(t, key(m.Name), &clusterv1.Machine{}) && !get(t, key(m.Name), &infrav1.NstanceMachine{})
		}, waitLong, tick, "Machine, NstanceMachine and the Node in B are gone")
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, f.shard, instanceID))
		require.False(t, exists(t, wl, key("guarded"), &corev1.Pod{}))
		require.Equal(t, 1, a.count(instanceID), "the operator drained once")
		require.Contains(t, nodeReasonsIn(t, wl, node.Name), drain.ReasonDrained)
		require.Empty(t, nodeReasonsIn(t, env.Client, node.Name), "no Node Events in A")
		require.Empty(t, events(t, f.ns, "Machine", m.Name, "SuccessfulDrainNode"), "core CAPI did not drain again")
	})

	t.Run("an on-demand pod in the workload cluster gets an instance", func(t *testing.T) {
		// The operator's namespace, the one that may hold on-demand pods
		// by default, of the workload cluster.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, GenerateName: "job-", Annotations: map[string]string{ondemand.AnnotationGroup: "solo"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/job"}}},
		}
		require.NoError(t, wl.Create(ctx, pod))
		name := ondemand.Name(pod)
		var m clusterv1.Machine
		require.Eventually(t, func() bool {
			return get(t, key(name), &m) && m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.Status.NodeRef.IsDefined()
		}, waitLong, tick, "the pod's Machine runs and core CAPI finds its Node in B")
		var nm infrav1.NstanceMachine
		require.True(t, get(t, key(name), &nm))
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shard, nm.Status.InstanceID))
		_, ok := nodeIn(t, wl, nm.Spec.ProviderID)
		require.True(t, ok)

		require.NoError(t, wl.Delete(ctx, pod))
		require.Eventually(t, func() bool {
			return !exists(t, wl, client.ObjectKeyFromObject(pod), &corev1.Pod{}) && !get(t, key(name), &clusterv1.Machine{})
		}, drainWait, tick, "pod, Machine and NstanceMachine go")
		require.Eventually(t, func() bool {
			return instanceState(t, f.shard, nm.Status.InstanceID) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
		}, waitLong, tick)
	})
}

func exists(t *testing.T, c client.Client, key client.ObjectKey, obj client.Object) bool {
	t.Helper()
	err := c.Get(context.Background(), key, obj)
	if err != nil {
		require.True(t, client.IgnoreNotFound(err) == nil, "get %s: %v", key, err)
		return false
	}
	return true
}

func nodeIn(t *testing.T, c client.Client, providerID string) (corev1.Node, bool) {
	t.Helper()
	var nodes corev1.NodeList
	require.NoError(t, c.List(context.Background(), &nodes))
	for _, n := range nodes.Items {
		if n.Spec.ProviderID == providerID {
			return n, true
		}
	}
	return corev1.Node{}, false
}

func podIn(t *testing.T, c client.Client, ns, name, node string, labels map[string]string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}}},
	}
	require.NoError(t, c.Create(context.Background(), p))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	require.NoError(t, c.Status().Update(context.Background(), p))
}

// pdbAllowedIn plays the disruption controller in the cluster of c.
func pdbAllowedIn(t *testing.T, c client.Client, ns, name string, allowed int32) {
	t.Helper()
	require.Eventually(t, func() bool {
		var pdb policyv1.PodDisruptionBudget
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pdb); err != nil {
			return false
		}
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
			CurrentHealthy: 1, DesiredHealthy: 1 - allowed, ExpectedPods: 1}
		return c.Status().Update(context.Background(), &pdb) == nil
	}, waitLong, tick)
}

// nodeReasonsIn are the reasons of Events about a Node in the cluster of c.
func nodeReasonsIn(t *testing.T, c client.Client, node string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.List(context.Background(), &list))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == node {
			out = append(out, e.Reason)
		}
	}
	return out
}
