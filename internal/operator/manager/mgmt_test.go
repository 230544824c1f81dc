package manager_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/controlplane"
	"github.com/nstance-dev/nstance/internal/operator/drain"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// clusterMode is one way the operator reaches Nodes and Pods: in-cluster
// (the workload cluster is the operator's own, A) or management (the
// operator runs in A, Nodes and Pods are in a second API server B, reached
// through the <cluster>-kubeconfig Secret in A).
type clusterMode struct {
	mode workload.Mode
	// wl is a client of the workload cluster: A's or B's.
	wl client.Client
	// b is cluster B in management mode.
	b *kubetest.Env
}

func (m clusterMode) management() bool { return m.mode == workload.Management }

// forEachMode runs body once per mode, as subtests named after the mode.
func forEachMode(t *testing.T, body func(t *testing.T, m clusterMode)) {
	t.Run(string(workload.InCluster), func(t *testing.T) {
		body(t, clusterMode{mode: workload.InCluster, wl: env.Client})
	})
	t.Run(string(workload.Management), func(t *testing.T) {
		b := clusterB.Get(t)
		body(t, clusterMode{mode: workload.Management, wl: b.Client, b: b})
	})
}

// prepare sets the fixture up for mode m: in management mode the fixture's
// namespace also exists in B (the pods of the tests live there) and the
// operator runs with --workload-cluster=management. withSecret writes B's
// kubeconfig into the <cluster>-kubeconfig Secret in A, in Cluster API's
// format, as whoever created the workload cluster would.
func (f *fixture) prepare(t testing.TB, m clusterMode, o *manager.Options, withSecret bool) {
	t.Helper()
	o.WorkloadMode = m.mode
	if !m.management() {
		return
	}
	o.WorkloadConnectRetry = 200 * time.Millisecond
	ensureNamespace(t, m.wl, f.ns)
	if withSecret {
		f.putKubeconfig(t, m)
	}
}

func ensureNamespace(t testing.TB, c client.Client, name string) {
	t.Helper()
	err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
}

func (f *fixture) putKubeconfig(t testing.TB, m clusterMode) {
	t.Helper()
	data, err := os.ReadFile(m.b.Kubeconfig)
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: controlplane.KubeconfigSecretName(clusterID),
			Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": data},
	}))
}

// started finishes what prepare began once the operator runs: in management
// mode it reports the Cluster's infrastructure provisioned, as core Cluster
// API's Cluster controller does from the NstanceCluster (the ClusterCache
// connects only to provisioned Clusters; core CAPI runs beside the operator
// only in internal/operator/capicontract).
func (f *fixture) started(t testing.TB, m clusterMode) {
	t.Helper()
	if !m.management() {
		return
	}
	require.Eventually(t, func() bool {
		var c clusterv1.Cluster
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: clusterID}, &c); err != nil {
			return false
		}
		c.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
		return env.Client.Status().Update(context.Background(), &c) == nil
	}, waitLong, tick)
}

// A drain never ends for want of the workload cluster: while the kubeconfig
// Secret is missing the drain waits and says so on the Cluster; once the
// Secret exists the Node in B is drained.
func TestDrainWaitsForWorkloadCluster(t *testing.T) {
	b := clusterB.Get(t)
	m := clusterMode{mode: workload.Management, wl: b.Client, b: b}
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	a := newAcks()
	o := f.options(t)
	o.DrainRetryInterval, o.MachinePollInterval = 100*time.Millisecond, 100*time.Millisecond
	o.OnDrainAcknowledged = a.record
	f.prepare(t, m, &o, false)
	r := startOperator(t, o)
	f.started(t, m)
	r.waitImported(t)
	shardA := f.shards["shard-a"]
	// A Machine's instance, so the wait also shows on an NstanceMachine.
	f.createPoolDrain(t, "solo", 0, time.Minute, "shard-a")
	f.waitGroupOnShards(t, "solo", "shard-a")
	f.machinePair(t, "m-wait", "solo", "shard-a")
	nm := waitMachineRunning(t, f.ns, "m-wait")
	deleteOnServer(t, shardA, nm.Status.InstanceID)

	inst := onDemand(t, shardA, 60*time.Second)
	node := "node-" + inst.GetInstanceId()
	createNode(t, m.wl, node, inst.GetProviderId())
	createPod(t, m.wl, f.ns, "waits", node, plainPod, nil)
	deleteInstance(t, shardA, inst.GetInstanceId())

	require.Eventually(t, func() bool {
		return len(f.events(t, "Cluster", clusterID, drain.ReasonWorkloadUnreachable)) > 0
	}, waitLong, tick, "the waiting drain is reported on the Cluster")
	require.Eventually(t, func() bool {
		got, ok := get(t, f.ns, "m-wait", &infrav1.NstanceMachine{})
		c := meta.FindStatusCondition(got.Status.Conditions, drain.ConditionDrained)
		return ok && c != nil && c.Status == metav1.ConditionFalse && c.Reason == drain.ReasonWorkloadUnreachable &&
			len(f.events(t, "NstanceMachine", "m-wait", drain.ReasonWorkloadUnreachable)) > 0
	}, waitLong, tick, "and on the NstanceMachine, as condition and Event")
	// Several passes later still nothing was acknowledged.
	time.Sleep(5 * o.DrainRetryInterval)
	_, _, acked := a.get(inst.GetInstanceId())
	require.False(t, acked, "a drain is never acknowledged because the workload cluster is unreachable")
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, instanceState(t, shardA, inst.GetInstanceId()))
	require.True(t, podExists(t, m.wl, f.ns, "waits"))

	f.putKubeconfig(t, m)
	require.Eventually(t, func() bool {
		return instanceState(t, shardA, inst.GetInstanceId()) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
	}, waitLong, tick)
	_, skipped := a.wait(t, inst.GetInstanceId())
	require.False(t, skipped, "drained, not skipped")
	require.False(t, podExists(t, m.wl, f.ns, "waits"))
	require.True(t, nodeCordoned(t, m.wl, node))
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, "m-wait", &clusterv1.Machine{})
		return !ok
	}, waitLong, tick, "the Machine's instance, with no Node in B, is acknowledged and cleaned up once B answers")
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, shardA, nm.Status.InstanceID))
}
