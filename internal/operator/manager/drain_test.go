package manager_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/operator/drain"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// acks records acknowledged drains.
type acks struct {
	mu   sync.Mutex
	at   map[string]time.Time
	skip map[string]bool
}

func newAcks() *acks { return &acks{at: map[string]time.Time{}, skip: map[string]bool{}} }

func (a *acks) record(_, id string, skipped bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at[id], a.skip[id] = time.Now(), skipped
}

func (a *acks) get(id string) (time.Time, bool, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.at[id]
	return at, a.skip[id], ok
}

// wait waits until the drain of id was acknowledged and returns when and
// whether it was skipped. The server may delete the instance before the
// operator's callback runs, so an instance gone is no proof of it.
func (a *acks) wait(t testing.TB, id string) (time.Time, bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, _, ok := a.get(id)
		return ok
	}, waitLong, tick, "drain of %s acknowledged", id)
	at, skipped, _ := a.get(id)
	return at, skipped
}

// onDemand creates an instance directly on a shard and returns its status.
func onDemand(t testing.TB, f *fakeShard, drainTimeout time.Duration) *nstancev1.InstanceStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.client(t).CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker",
		DrainTimeout: durationpb.New(drainTimeout), ClientToken: fmt.Sprintf("t-%d", time.Now().UnixNano())})
	require.NoError(t, err)
	inst := resp.GetInstance()
	require.NotEmpty(t, inst.GetProviderId())
	require.Eventually(t, func() bool {
		st := instanceState(t, f, inst.GetInstanceId())
		return st == nstancev1.InstanceState_INSTANCE_STATE_RUNNING
	}, waitLong, tick)
	return inst
}

// instanceState returns the server's state of an instance; DELETED when it is gone.
func instanceState(t testing.TB, f *fakeShard, id string) nstancev1.InstanceState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.client(t).GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
	if status.Code(err) == codes.NotFound {
		return nstancev1.InstanceState_INSTANCE_STATE_DELETED
	}
	require.NoError(t, err)
	return resp.GetInstance().GetState()
}

func deleteInstance(t testing.TB, f *fakeShard, id string) time.Time {
	t.Helper()
	resp, err := f.client(t).DeleteInstance(context.Background(), &nstancev1.DeleteInstanceRequest{InstanceId: id})
	require.NoError(t, err)
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, resp.GetInstance().GetState())
	return resp.GetInstance().GetDrainDeadline().AsTime()
}

// waitNodeCached waits until the operator's cache of the workload cluster
// finds the Node by providerID, as the drain coordinator looks it up: a
// drain announced before that would find no Node and be acknowledged at
// once, which is right for the operator (in a cluster the Node registered
// long before) but not what these tests set up.
func (r *running) waitNodeCached(t testing.TB, providerID string) {
	t.Helper()
	require.Eventually(t, func() bool {
		wl, err := r.op.Workload.Cluster(context.Background(), r.op.Cluster)
		if err != nil {
			return false
		}
		var nodes corev1.NodeList
		err = wl.Client.List(context.Background(), &nodes, client.MatchingFields{drain.NodeProviderIDIndex: providerID})
		return err == nil && len(nodes.Items) == 1
	}, waitLong, tick)
}

// The helpers below act on the cluster of client c: A (env.Client) or the
// workload cluster B of the management-mode tests.

func createNode(t testing.TB, c client.Client, name, providerID string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: providerID}}
	require.NoError(t, c.Create(context.Background(), node))
	t.Cleanup(func() { _ = c.Delete(context.Background(), node) })
}

type podKind int

const (
	plainPod podKind = iota
	// daemonSetPod is a pod of a DaemonSet that exists, created as its
	// controller creates them (envtest runs no controllers).
	daemonSetPod
	// orphanedDaemonSetPod names a DaemonSet controller that is gone.
	orphanedDaemonSetPod
	mirrorPod
)

func createPod(t testing.TB, c client.Client, ns, name, node string, kind podKind, labels map[string]string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}}},
	}
	switch kind {
	case daemonSetPod:
		ds := &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ds-" + name},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"ds": name}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"ds": name}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/agent"}}},
				},
			},
		}
		require.NoError(t, c.Create(context.Background(), ds))
		p.Labels = map[string]string{"ds": name, "pod-template-generation": "1"}
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}
	case orphanedDaemonSetPod:
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "gone", UID: types.UID("gone-" + name),
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	case mirrorPod:
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
	}
	require.NoError(t, c.Create(context.Background(), p))
	// Running and ready, as a kubelet would report: the Eviction API lets
	// pending pods go regardless of PodDisruptionBudgets.
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	require.NoError(t, c.Status().Update(context.Background(), p))
}

func podExists(t testing.TB, c client.Client, ns, name string) bool {
	t.Helper()
	_, ok := getIn(t, c, ns, name, &corev1.Pod{})
	return ok
}

func createPDB(t testing.TB, c client.Client, ns, name string, selector map[string]string) {
	t.Helper()
	require.NoError(t, c.Create(context.Background(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: selector}},
	}))
}

// allowPDB plays the disruption controller (not part of envtest): it
// reports one allowed disruption.
func allowPDB(t testing.TB, c client.Client, ns, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var pdb policyv1.PodDisruptionBudget
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pdb); err != nil {
			return false
		}
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 1,
			CurrentHealthy: 1, DesiredHealthy: 0, ExpectedPods: 1}
		return c.Status().Update(context.Background(), &pdb) == nil
	}, waitLong, tick)
}

func nodeCordoned(t testing.TB, c client.Client, name string) bool {
	t.Helper()
	n, ok := getIn(t, c, "", name, &corev1.Node{})
	return ok && n.Spec.Unschedulable
}

// nodeEvents returns the notes of Events with reason about a Node.
func nodeEvents(t testing.TB, c client.Client, node, reason string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.List(context.Background(), &list))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == node && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

func TestDrain(t *testing.T) { forEachMode(t, testDrain) }

func testDrain(t *testing.T, m clusterMode) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	a := newAcks()
	o := f.options(t)
	o.DrainRetryInterval = 100 * time.Millisecond
	o.OnDrainAcknowledged = a.record
	reg := prometheus.NewRegistry()
	o.MetricsRegistry = reg
	f.prepare(t, m, &o, true)
	r := startOperator(t, o)
	f.started(t, m)
	r.waitImported(t)
	shardA, shardB := f.shards["shard-a"], f.shards["shard-b"]
	// metric reads one sample of the operator's registry (0 when absent).
	metric := func(name string, labels ...string) float64 {
		fams, err := reg.Gather()
		require.NoError(t, err)
		for _, fam := range fams {
			if fam.GetName() != name {
				continue
			}
		next:
			for _, mt := range fam.GetMetric() {
				for i := 0; i+1 < len(labels); i += 2 {
					found := false
					for _, l := range mt.GetLabel() {
						found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
					}
					if !found {
						continue next
					}
				}
				switch {
				case mt.GetCounter() != nil:
					return mt.GetCounter().GetValue()
				case mt.GetGauge() != nil:
					return mt.GetGauge().GetValue()
				case mt.GetHistogram() != nil:
					return float64(mt.GetHistogram().GetSampleCount())
				}
			}
		}
		return 0
	}

	t.Run("eleven pods with a DaemonSet's, an orphaned DaemonSet's, a mirror and a PDB-protected pod", func(t *testing.T) {
		inst := onDemand(t, shardA, 30*time.Second)
		node := "node-" + inst.GetInstanceId()
		createNode(t, m.wl, node, inst.GetProviderId())
		r.waitNodeCached(t, inst.GetProviderId())
		for i := range 7 {
			createPod(t, m.wl, f.ns, fmt.Sprintf("app-%d", i), node, plainPod, nil)
		}
		createPod(t, m.wl, f.ns, "ds", node, daemonSetPod, nil)
		createPod(t, m.wl, f.ns, "ds-orphan", node, orphanedDaemonSetPod, nil)
		createPod(t, m.wl, f.ns, "mirror", node, mirrorPod, nil)
		createPod(t, m.wl, f.ns, "guarded", node, plainPod, map[string]string{"app": "guarded"})
		createPDB(t, m.wl, f.ns, "guarded", map[string]string{"app": "guarded"})
		if m.management() {
			// The same Node and a pod on it in A, the operator's cluster,
			// which a drain must not touch.
			createNode(t, env.Client, node, inst.GetProviderId())
			createPod(t, env.Client, f.ns, "app-0", node, plainPod, nil)
		}

		deadline := deleteInstance(t, shardA, inst.GetInstanceId())
		require.Eventually(t, func() bool {
			for i := range 7 {
				if podExists(t, m.wl, f.ns, fmt.Sprintf("app-%d", i)) {
					return false
				}
			}
			if podExists(t, m.wl, f.ns, "ds-orphan") {
				return false // kubectl drain --force evicts it: no controller puts it back
			}
			return nodeCordoned(t, m.wl, node) && len(nodeEvents(t, m.wl, node, drain.ReasonEvictionBlocked)) > 0
		}, waitLong, tick)
		require.True(t, podExists(t, m.wl, f.ns, "guarded"), "a PDB refusal is retried, not skipped")
		_, _, acked := a.get(inst.GetInstanceId())
		require.False(t, acked, "no acknowledgement while a pod remains")
		require.Equal(t, 1.0, metric("nstance_operator_drains_pending"), "the blocked drain is pending")
		require.GreaterOrEqual(t, metric("nstance_operator_evictions_total", "outcome", "evicted"), 7.0)
		require.GreaterOrEqual(t, metric("nstance_operator_evictions_total", "outcome", "blocked"), 1.0, "the PDB refusal is counted")
		require.Equal(t, 0.0, metric("nstance_operator_drain_duration_seconds", "shard", "shard-a", "outcome", "drained"))
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, instanceState(t, shardA, inst.GetInstanceId()))

		allowPDB(t, m.wl, f.ns, "guarded")
		require.Eventually(t, func() bool {
			return instanceState(t, shardA, inst.GetInstanceId()) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
		}, waitLong, tick)
		at, skipped := a.wait(t, inst.GetInstanceId())
		require.False(t, skipped)
		require.True(t, at.Before(deadline), "acknowledged at %s, deadline %s", at, deadline)
		require.Equal(t, 1.0, metric("nstance_operator_drain_duration_seconds", "shard", "shard-a", "outcome", "drained"), "one drain took its time")
		require.GreaterOrEqual(t, metric("nstance_operator_evictions_total", "outcome", "evicted"), 8.0, "the guarded pod too, once allowed")
		require.False(t, podExists(t, m.wl, f.ns, "guarded"))
		require.True(t, podExists(t, m.wl, f.ns, "ds"), "pods of an existing DaemonSet stay (kubectl drain --ignore-daemonsets)")
		require.True(t, podExists(t, m.wl, f.ns, "mirror"), "mirror pods stay")
		require.Eventually(t, func() bool { return len(nodeEvents(t, m.wl, node, drain.ReasonDrained)) > 0 }, waitLong, tick)
		if m.management() {
			require.True(t, podExists(t, env.Client, f.ns, "app-0"), "nothing is evicted in the management cluster")
			require.False(t, nodeCordoned(t, env.Client, node), "nothing is cordoned in the management cluster")
			require.Empty(t, nodeEvents(t, env.Client, node, drain.ReasonDrained), "Node Events go to the workload cluster")
		}
	})

	t.Run("VM already stopped: acknowledged without drain", func(t *testing.T) {
		inst := onDemand(t, shardB, 30*time.Second)
		node := "node-" + inst.GetInstanceId()
		createNode(t, m.wl, node, inst.GetProviderId())
		r.waitNodeCached(t, inst.GetProviderId())
		createPod(t, m.wl, f.ns, "stays", node, plainPod, nil)
		shardB.sh.Provider.(*mock.Provider).Stop(inst.GetInstanceId())
		require.Eventually(t, func() bool {
			_, _, ok := a.get(inst.GetInstanceId())
			return ok
		}, waitLong, tick)
		_, skipped, _ := a.get(inst.GetInstanceId())
		require.True(t, skipped)
		require.Equal(t, 1.0, metric("nstance_operator_drain_duration_seconds", "shard", "shard-b", "outcome", "skipped"))
		require.True(t, podExists(t, m.wl, f.ns, "stays"), "no eviction")
		require.False(t, nodeCordoned(t, m.wl, node), "no cordon")
		require.Eventually(t, func() bool { return len(nodeEvents(t, m.wl, node, drain.ReasonDrainSkipped)) > 0 }, waitLong, tick)
		require.Eventually(t, func() bool {
			return instanceState(t, shardB, inst.GetInstanceId()) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
		}, waitLong, tick)
	})

	t.Run("three drains progress in parallel", func(t *testing.T) {
		type victim struct {
			shard *fakeShard
			inst  *nstancev1.InstanceStatus
			node  string
		}
		var vs []victim
		for i, sh := range []*fakeShard{shardA, shardB, shardA} {
			inst := onDemand(t, sh, 30*time.Second)
			v := victim{shard: sh, inst: inst, node: "node-" + inst.GetInstanceId()}
			createNode(t, m.wl, v.node, inst.GetProviderId())
			r.waitNodeCached(t, inst.GetProviderId())
			label := map[string]string{"app": fmt.Sprintf("par-%d", i)}
			createPod(t, m.wl, f.ns, fmt.Sprintf("par-%d", i), v.node, plainPod, label)
			createPDB(t, m.wl, f.ns, fmt.Sprintf("par-%d", i), label)
			vs = append(vs, v)
		}
		for _, v := range vs {
			deleteInstance(t, v.shard, v.inst.GetInstanceId())
		}
		// Every drain is cordoned and blocked at the same time: none waits
		// for another to finish.
		require.Eventually(t, func() bool {
			for _, v := range vs {
				if !nodeCordoned(t, m.wl, v.node) || len(nodeEvents(t, m.wl, v.node, drain.ReasonEvictionBlocked)) == 0 {
					return false
				}
			}
			return true
		}, waitLong, tick)
		for i := range vs {
			allowPDB(t, m.wl, f.ns, fmt.Sprintf("par-%d", i))
		}
		for _, v := range vs {
			require.Eventually(t, func() bool {
				return instanceState(t, v.shard, v.inst.GetInstanceId()) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
			}, waitLong, tick)
			_, skipped := a.wait(t, v.inst.GetInstanceId())
			require.False(t, skipped)
		}
	})
}

// A drain announced while no operator runs is acknowledged by the next one:
// the server re-announces pending drains when the stream opens.
func TestDrainAnnouncedWhileOperatorDown(t *testing.T) {
	forEachMode(t, testDrainAnnouncedWhileOperatorDown)
}

func testDrainAnnouncedWhileOperatorDown(t *testing.T, m clusterMode) {
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	a := newAcks()
	o := f.options(t)
	o.DrainRetryInterval = 100 * time.Millisecond
	o.OnDrainAcknowledged = a.record
	f.prepare(t, m, &o, true)
	shardA := f.shards["shard-a"]
	inst := onDemand(t, shardA, 30*time.Second)
	createNode(t, m.wl, "node-"+inst.GetInstanceId(), inst.GetProviderId())
	createPod(t, m.wl, f.ns, "late", "node-"+inst.GetInstanceId(), plainPod, nil)
	deadline := deleteInstance(t, shardA, inst.GetInstanceId())

	startOperator(t, o)
	f.started(t, m)
	require.Eventually(t, func() bool {
		return instanceState(t, shardA, inst.GetInstanceId()) == nstancev1.InstanceState_INSTANCE_STATE_DELETED
	}, waitLong, tick)
	at, skipped := a.wait(t, inst.GetInstanceId())
	require.False(t, skipped)
	require.True(t, at.Before(deadline))
	require.False(t, podExists(t, m.wl, f.ns, "late"))
}
