package capicontract_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	capimd "sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	capimhc "sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	capims "sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	"sigs.k8s.io/cluster-api/core/setup"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// startCAPIRemediation runs core Cluster API's MachineDeployment,
// MachineSet and MachineHealthCheck controllers (with their own
// ClusterCache) beside what startCAPI runs, until the test ends.
func startCAPIRemediation(t *testing.T, ns string, log logr.Logger) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	// Every namespace: the MachineDeployment and MachineSet controllers
	// wait for their cache through its informers' stores, which a cache
	// restricted to namespaces does not hand out. Only ns holds
	// MachineDeployments, MachineSets and MachineHealthChecks.
	runCAPIManager(t, ctx, cancel, scheme, "capi-remediation", setup.ManagerCacheOptions(scheme, "capi-remediation-"+ns, "", 10*time.Minute), log,
		func(ctx context.Context, mgr ctrl.Manager, _ clustercache.ClusterCache, opts controller.Options) error {
			return (&capimd.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(ctx, mgr, opts)
		},
		func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error {
			return (&capims.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).SetupWithManager(ctx, mgr, opts)
		},
		func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error {
			return (&capimhc.Reconciler{Client: mgr.GetClient(), ClusterCache: cc}).SetupWithManager(ctx, mgr, opts)
		})
}

// TestMachineHealthCheckReplacesUnhealthyMachine: a MachineDeployment of
// NstanceMachines under a MachineHealthCheck. When the Machine's Node
// reports NotReady, the MachineHealthCheck marks the Machine unhealthy, its
// MachineSet deletes it, and a new Machine with a new instance takes its
// place; the old instance is deleted on the server.
func TestMachineHealthCheckReplacesUnhealthyMachine(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	bindCAPIWorkloadRole(t, f.ns)
	startOperator(t, f.opts)
	logs := &capiLog{}
	startCAPI(t, f.ns, logs.logger())
	startCAPIRemediation(t, f.ns, logs.logger())
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
		return get(t, key(clusterID), &cluster) && ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false)
	}, waitLong, tick, "core CAPI sees the control plane initialized")

	// The group the Machines' instances join (on-demand members, size 0).
	f.createPool(t, "md", 0, 30*time.Second)
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "md"},
		Spec: infrav1.NstanceMachineTemplateSpec{Template: infrav1.NstanceMachineTemplateResource{
			Spec: infrav1.NstanceMachineSpec{Group: "md"}}},
	}))
	selected := map[string]string{clusterv1.ClusterNameLabel: clusterID, "nstance.dev/test-md": "md"}
	// Fields CAPI's defaulting webhooks would set are given explicitly.
	require.NoError(t, env.Client.Create(ctx, &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "md", Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: clusterID, Replicas: ptr.To[int32](1),
			Selector: metav1.LabelSelector{MatchLabels: selected},
			Rollout: clusterv1.MachineDeploymentRolloutSpec{Strategy: clusterv1.MachineDeploymentRolloutStrategy{
				Type: clusterv1.RollingUpdateMachineDeploymentStrategyType,
				RollingUpdate: clusterv1.MachineDeploymentRolloutStrategyRollingUpdate{
					MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
			}},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: selected},
				Spec: clusterv1.MachineSpec{
					ClusterName: clusterID, FailureDomain: shardID,
					Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(bootstrapSecret)},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachineTemplate", Name: "md"},
				},
			},
		},
	}))
	require.NoError(t, env.Client.Create(ctx, &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "md", Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: clusterID,
			Selector:    metav1.LabelSelector{MatchLabels: selected},
			Checks: clusterv1.MachineHealthCheckChecks{UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](1)},
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To[int32](300)},
			}},
		},
	}))

	// running waits for the single Machine of the MachineDeployment to run
	// with a Node and returns it with its NstanceMachine.
	running := func(not string) (clusterv1.Machine, infrav1.NstanceMachine) {
		t.Helper()
		var m clusterv1.Machine
		var nm infrav1.NstanceMachine
		require.Eventually(t, func() bool {
			var list clusterv1.MachineList
			require.NoError(t, env.Client.List(ctx, &list, client.InNamespace(f.ns), client.MatchingLabels(selected)))
			if len(list.Items) != 1 {
				return false
			}
			m = list.Items[0]
			return m.Name != not && m.DeletionTimestamp.IsZero() && m.Status.Phase == string(clusterv1.MachinePhaseRunning) &&
				m.Status.NodeRef.IsDefined() && get(t, key(m.Spec.InfrastructureRef.Name), &nm) && nm.Status.InstanceID != ""
		}, drainWait, tick, "the MachineDeployment's Machine runs with a Node")
		return m, nm
	}
	old, oldNM := running("")
	oldInstance := oldNM.Status.InstanceID
	var mhc clusterv1.MachineHealthCheck
	require.Eventually(t, func() bool {
		return get(t, key("md"), &mhc) && ptr.Deref(mhc.Status.ExpectedMachines, 0) == 1 && ptr.Deref(mhc.Status.CurrentHealthy, 0) == 1
	}, waitLong, tick, "the MachineHealthCheck watches the Machine and finds it healthy")

	// The Node goes NotReady, as when its kubelet stops reporting healthy.
	require.Eventually(t, func() bool {
		var node corev1.Node
		if !get(t, client.ObjectKey{Name: old.Status.NodeRef.Name}, &node) {
			return false
		}
		for i := range node.Status.Conditions {
			if node.Status.Conditions[i].Type == corev1.NodeReady {
				node.Status.Conditions[i].Status = corev1.ConditionFalse
				node.Status.Conditions[i].Reason = "KubeletNotReady"
				node.Status.Conditions[i].LastTransitionTime = metav1.Now()
			}
		}
		return env.Client.Status().Update(ctx, &node) == nil
	}, waitLong, tick)

	require.Eventually(t, func() bool {
		return len(events(t, f.ns, "Machine", old.Name, capimhc.EventMachineMarkedUnhealthy)) > 0
	}, waitLong, tick, "the MachineHealthCheck marks the Machine unhealthy")
	m, nm := running(old.Name)
	require.NotEqual(t, oldNM.Name, nm.Name)
	require.NotEqual(t, oldInstance, nm.Status.InstanceID, "the replacement has a new instance")
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shard, nm.Status.InstanceID))
	require.Eventually(t, func() bool {
		return !get(t, key(old.Name), &clusterv1.Machine{}) && !get(t, key(oldNM.Name), &infrav1.NstanceMachine{})
	}, drainWait, tick, "the unhealthy Machine and its NstanceMachine are gone")
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, f.shard, oldInstance), "the old instance is deleted")
	_, ok := nodeByProviderID(t, oldNM.Spec.ProviderID)
	require.False(t, ok, "core CAPI deletes the old Node")
	require.NotEqual(t, old.Status.NodeRef.Name, m.Status.NodeRef.Name)
}
