package rollguard_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/rollguard"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// TestGuardFollowsRollingOut runs the controller against a real API server:
// setting the pool's RollingOut condition (status subresource) puts
// cluster-autoscaler's scale-down-disabled annotation on the pool's Nodes
// (a Node joining meanwhile too); clearing it removes them again. A user's
// own annotation, on a pool Node and on another Node, survives both, and a
// Node of no pool is never touched.
func TestGuardFollowsRollingOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "guard-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	sfx := ns.Name // Node names unique per run (go test -count=2)
	pid := func(n string) string { return "nstance://guard/s1/" + n + "-" + sfx }
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "workers"},
		Spec: infrav1.NstanceMachinePoolSpec{Group: "workers", Shards: []string{"s1"},
			ProviderIDList: []string{pid("a"), pid("users"), pid("late")}},
	}
	require.NoError(t, env.Client.Create(ctx, pool))
	mk := func(name string, ann map[string]string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + sfx, Annotations: ann}, Spec: corev1.NodeSpec{ProviderID: pid(name)}}
		require.NoError(t, env.Client.Create(ctx, n))
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
		return n
	}
	a := mk("a", nil)
	users := mk("users", map[string]string{rollguard.ScaleDownDisabledAnnotation: "true"})
	stranger := mk("stranger", nil)

	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme, Logger: logr.Discard(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns.Name: {}}},
		Controller: crconfig.Controller{SkipNameValidation: new(true)},
	})
	require.NoError(t, err)
	wl, err := workload.NewLocal(ctx, mgr, env.Config)
	require.NoError(t, err)
	r := &rollguard.Reconciler{Client: mgr.GetClient(), Workload: wl, Cluster: client.ObjectKey{Namespace: ns.Name, Name: "c"},
		Recheck: 200 * time.Millisecond, Log: logr.Discard()}
	require.NoError(t, r.SetupWithManager(mgr))
	mctx, mcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { mcancel(); <-done })

	annotations := func(n *corev1.Node) map[string]string {
		var got corev1.Node
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(n), &got))
		return got.Annotations
	}
	guarded := func(n *corev1.Node) bool {
		ann := annotations(n)
		return ann[rollguard.ScaleDownDisabledAnnotation] == "true" && ann[rollguard.OwnedAnnotation] == "true"
	}
	setRolling := func(st metav1.ConditionStatus) {
		var p infrav1.NstanceMachinePool
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p))
		conditions.Set(&p, metav1.Condition{Type: infrav1.RollingOutCondition, Status: st, Reason: "Test"})
		require.NoError(t, env.Client.Status().Update(ctx, &p))
	}

	// The user's Node and the Node of no pool are never written: their
	// resourceVersions stay as they are now, through both transitions.
	rvBefore := func(n *corev1.Node) string {
		var got corev1.Node
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(n), &got))
		return got.ResourceVersion
	}
	strangerRV := rvBefore(stranger)
	usersRV := rvBefore(users)

	setRolling(metav1.ConditionTrue)
	require.Eventually(t, func() bool { return guarded(a) }, 30*time.Second, 50*time.Millisecond, "pool Node guarded")
	// A member joining mid-rollout is guarded too.
	late := mk("late", nil)
	require.Eventually(t, func() bool { return guarded(late) }, 30*time.Second, 50*time.Millisecond, "late Node guarded")
	require.NotContains(t, annotations(users), rollguard.OwnedAnnotation, "a user's annotation is never recorded as ours")
	held := func() bool {
		var p infrav1.NstanceMachinePool
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p))
		_, ok := p.Annotations[rollguard.HeldAnnotation]
		return ok
	}
	require.True(t, held(), "the pool records that its Nodes are guarded")

	setRolling(metav1.ConditionFalse)
	require.Eventually(t, func() bool {
		for _, n := range []*corev1.Node{a, late} {
			ann := annotations(n)
			if _, ok := ann[rollguard.ScaleDownDisabledAnnotation]; ok {
				return false
			}
			if _, ok := ann[rollguard.OwnedAnnotation]; ok {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "released")
	require.Eventually(t, func() bool { return !held() }, 30*time.Second, 50*time.Millisecond, "the record goes with the guards")
	require.Equal(t, "true", annotations(users)[rollguard.ScaleDownDisabledAnnotation], "the user's annotation survives")
	require.Equal(t, usersRV, rvBefore(users), "the user's Node was never written")
	require.Equal(t, strangerRV, rvBefore(stranger), "a Node of no pool was never written")
}

// staleCache answers every Node list with the copies it was given, as an
// informer that has not yet seen the latest writes does.
type staleCache struct {
	client.Client
	nodes []corev1.Node
}

func (s staleCache) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	list.(*corev1.NodeList).Items = append([]corev1.Node(nil), s.nodes...)
	return nil
}

type fixedWorkload struct {
	workload.Access
	wl *workload.Cluster
}

func (f fixedWorkload) Cluster(context.Context, client.ObjectKey) (*workload.Cluster, error) {
	return f.wl, nil
}

// TestReleaseReadsPastAStaleCache: the rollout ends right after a member's
// Node was guarded, and the cache still shows that Node without the guard.
// The pool's held record makes the release read the Node from the API
// server and remove the guard; the record goes only after that.
func TestReleaseReadsPastAStaleCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "guard-stale-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	pid := "nstance://guard/s1/late-" + ns.Name
	stale := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "late-" + ns.Name}, Spec: corev1.NodeSpec{ProviderID: pid}}
	n := stale.DeepCopy()
	n.Annotations = map[string]string{rollguard.ScaleDownDisabledAnnotation: "true", rollguard.OwnedAnnotation: "true"}
	require.NoError(t, env.Client.Create(ctx, n))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "workers", Annotations: map[string]string{rollguard.HeldAnnotation: "true"}},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: "workers", Shards: []string{"s1"}, ProviderIDList: []string{pid}},
	}
	require.NoError(t, env.Client.Create(ctx, pool))

	wl := &workload.Cluster{Client: staleCache{Client: env.Client, nodes: []corev1.Node{stale}}, Reader: env.Client}
	r := &rollguard.Reconciler{Client: env.Client, Workload: fixedWorkload{wl: wl}, Cluster: client.ObjectKey{Namespace: ns.Name, Name: "c"}, Log: logr.Discard()}
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)})
	require.NoError(t, err)

	var got corev1.Node
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(n), &got))
	require.NotContains(t, got.Annotations, rollguard.ScaleDownDisabledAnnotation, "the guard the cache did not show is released")
	require.NotContains(t, got.Annotations, rollguard.OwnedAnnotation)
	var p infrav1.NstanceMachinePool
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p))
	require.NotContains(t, p.Annotations, rollguard.HeldAnnotation, "the record goes with the last guard")
}
