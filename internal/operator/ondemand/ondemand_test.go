package ondemand

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// access hands out one fixed workload cluster (or an error).
type access struct {
	cl  *workload.Cluster
	err error
}

func (a access) Cluster(context.Context, client.ObjectKey) (*workload.Cluster, error) {
	return a.cl, a.err
}

func (a access) Watch(client.ObjectKey, controller.Controller, string, client.Object, handler.EventHandler, ...predicate.Predicate) error {
	return nil
}

func (a access) Mode() workload.Mode { return "" }

type fixture struct {
	r        *Reconciler
	op       client.Client
	wl       client.Client
	recorder *record.FakeRecorder
}

// newFixture builds the operator's cluster (Cluster c1 in namespace ops)
// and a workload cluster holding pods; local says whether the two are the
// same cluster.
func newFixture(t *testing.T, local, paused bool, pods ...*corev1.Pod) fixture {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "c1"}}
	if paused {
		cluster.Spec.Paused = ptr.To(true)
	}
	op := fake.NewClientBuilder().WithScheme(s).WithObjects(cluster).Build()
	b := fake.NewClientBuilder().WithScheme(s)
	for _, p := range pods {
		b = b.WithObjects(p)
	}
	wl := b.Build()
	rec := record.NewFakeRecorder(16)
	return fixture{
		r: &Reconciler{
			Client: op, Namespace: "ops", ClusterName: "c1", DefaultShard: "s-default",
			Workload: access{cl: &workload.Cluster{Client: wl, Reader: wl, Recorder: rec, Local: local}},
		},
		op: op, wl: wl, recorder: rec,
	}
}

func annotatedPod(ns string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-1", UID: "1234-abcd", Annotations: annotations}}
}

func request(p *corev1.Pod) reconcile.Request {
	return reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)}
}

func (f fixture) pair(t *testing.T, name string) (*infrav1.NstanceMachine, *clusterv1.Machine) {
	t.Helper()
	var nm infrav1.NstanceMachine
	require.NoError(t, f.op.Get(context.Background(), client.ObjectKey{Namespace: "ops", Name: name}, &nm))
	var m clusterv1.Machine
	require.NoError(t, f.op.Get(context.Background(), client.ObjectKey{Namespace: "ops", Name: name}, &m))
	return &nm, &m
}

func (f fixture) requireNoPair(t *testing.T, name string) {
	t.Helper()
	err := f.op.Get(context.Background(), client.ObjectKey{Namespace: "ops", Name: name}, &infrav1.NstanceMachine{})
	require.True(t, apierrors.IsNotFound(err), "NstanceMachine %s: %v", name, err)
	err = f.op.Get(context.Background(), client.ObjectKey{Namespace: "ops", Name: name}, &clusterv1.Machine{})
	require.True(t, apierrors.IsNotFound(err), "Machine %s: %v", name, err)
}

func TestName(t *testing.T) {
	require.Equal(t, "od-1234-abcd", Name(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job-1", UID: "1234-abcd"}}))
}

func TestInteresting(t *testing.T) {
	require.True(t, interesting(annotatedPod("a", map[string]string{AnnotationGroup: "g"})))
	require.False(t, interesting(annotatedPod("a", map[string]string{AnnotationShard: "s"})), "shard alone does not ask for a machine")
	p := annotatedPod("a", nil)
	require.False(t, interesting(p))
	p.Finalizers = []string{Finalizer}
	require.True(t, interesting(p), "a pod still holding the finalizer needs its cleanup")
}

func TestCreatesPairFromAnnotations(t *testing.T) {
	ctx := context.Background()
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "gpu", AnnotationInstanceType: "g5.xlarge", AnnotationShard: "s-b"})
	f := newFixture(t, true, false, pod)

	res, err := f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{}, res)

	nm, m := f.pair(t, "od-1234-abcd")
	require.Equal(t, infrav1.NstanceMachineSpec{Group: "gpu", InstanceType: "g5.xlarge", Shard: "s-b"}, nm.Spec)
	wantLabels := map[string]string{clusterv1.ClusterNameLabel: "c1", LabelPodNamespace: "ops", LabelPodName: "job-1"}
	require.Equal(t, wantLabels, nm.Labels)
	require.Equal(t, wantLabels, m.Labels)
	require.Equal(t, "c1", m.Spec.ClusterName)
	require.Equal(t, "s-b", m.Spec.FailureDomain, "the Machine's failure domain is the shard")
	require.Equal(t, clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: "od-1234-abcd"}, m.Spec.InfrastructureRef)
	require.Equal(t, ptr.To(""), m.Spec.Bootstrap.DataSecretName)
	// In-cluster, same namespace: the pod owns both.
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "job-1", UID: "1234-abcd"}}
	require.Equal(t, owner, nm.OwnerReferences)
	require.Equal(t, owner, m.OwnerReferences)

	var got corev1.Pod
	require.NoError(t, f.wl.Get(ctx, request(pod).NamespacedName, &got))
	require.Contains(t, got.Finalizers, Finalizer)
	require.Len(t, f.recorder.Events, 1)
	require.Contains(t, <-f.recorder.Events, ReasonCreated)

	// Again: nothing changes, no second Event.
	_, err = f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	require.Empty(t, f.recorder.Events)
}

func TestDefaultShardAndGroupInstanceType(t *testing.T) {
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "web"})
	f := newFixture(t, true, false, pod)
	_, err := f.r.Reconcile(context.Background(), request(pod))
	require.NoError(t, err)
	nm, m := f.pair(t, "od-1234-abcd")
	require.Equal(t, infrav1.NstanceMachineSpec{Group: "web", Shard: "s-default"}, nm.Spec, "no instance type: the group's")
	require.Equal(t, "s-default", m.Spec.FailureDomain)
}

func TestOwnerReferenceOnlyInCluster(t *testing.T) {
	for _, tt := range []struct {
		name  string
		local bool
		ns    string
	}{
		{"management mode (pod in the workload cluster)", false, "ops"},
		{"in-cluster pod in another namespace", true, "team-a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := annotatedPod(tt.ns, map[string]string{AnnotationGroup: "web"})
			f := newFixture(t, tt.local, false, pod)
			_, err := f.r.Reconcile(context.Background(), request(pod))
			require.NoError(t, err)
			nm, m := f.pair(t, "od-1234-abcd")
			require.Empty(t, nm.OwnerReferences)
			require.Empty(t, m.OwnerReferences)
			require.Equal(t, tt.ns, nm.Labels[LabelPodNamespace])
		})
	}
}

func TestPausedClusterWaits(t *testing.T) {
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "web"})
	f := newFixture(t, true, true, pod)
	res, err := f.r.Reconcile(context.Background(), request(pod))
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{RequeueAfter: time.Second}, res)
	require.Equal(t, pausePoll, res.RequeueAfter)
	f.requireNoPair(t, "od-1234-abcd")
	var got corev1.Pod
	require.NoError(t, f.wl.Get(context.Background(), request(pod).NamespacedName, &got))
	require.NotContains(t, got.Finalizers, Finalizer, "a paused Cluster's pods are not written")
}

func TestRemovesPairWhenAnnotationGoes(t *testing.T) {
	ctx := context.Background()
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "web"})
	f := newFixture(t, true, false, pod)
	_, err := f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	f.pair(t, "od-1234-abcd")

	var got corev1.Pod
	require.NoError(t, f.wl.Get(ctx, request(pod).NamespacedName, &got))
	delete(got.Annotations, AnnotationGroup)
	require.NoError(t, f.wl.Update(ctx, &got))
	_, err = f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	f.requireNoPair(t, "od-1234-abcd")
	require.NoError(t, f.wl.Get(ctx, request(pod).NamespacedName, &got))
	require.NotContains(t, got.Finalizers, Finalizer)
}

func TestRemovesPairWhenPodIsDeleted(t *testing.T) {
	ctx := context.Background()
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "web"})
	f := newFixture(t, true, false, pod)
	_, err := f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	f.pair(t, "od-1234-abcd")

	var got corev1.Pod
	require.NoError(t, f.wl.Get(ctx, request(pod).NamespacedName, &got))
	require.NoError(t, f.wl.Delete(ctx, &got), "the finalizer holds the pod")
	_, err = f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	f.requireNoPair(t, "od-1234-abcd")
	err = f.wl.Get(ctx, request(pod).NamespacedName, &got)
	require.True(t, apierrors.IsNotFound(err), "the pod goes once its finalizer is removed: %v", err)

	// A pod that is gone is no error.
	_, err = f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
}

func TestWorkloadUnreachableIsAnError(t *testing.T) {
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "web"})
	f := newFixture(t, true, false, pod)
	f.r.Workload = access{err: workload.ErrUnreachable}
	_, err := f.r.Reconcile(context.Background(), request(pod))
	require.True(t, errors.Is(err, workload.ErrUnreachable), "%v", err)
	f.requireNoPair(t, "od-1234-abcd")
}
