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

// pool is an NstanceMachinePool in namespace ops.
func pool(name, group string, od *infrav1.OnDemandSpec, shards ...string) *infrav1.NstanceMachinePool {
	return &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: group, Shards: shards, InstanceType: "m7i.large", OnDemand: od},
	}
}

// defaultPools are the pools of newFixture: web and gpu opt in (gpu also
// allows g5.xlarge), batch does not.
func defaultPools() []client.Object {
	return []client.Object{
		pool("web", "web", &infrav1.OnDemandSpec{Enabled: true}, "s-default", "s-b"),
		pool("gpu", "gpu", &infrav1.OnDemandSpec{Enabled: true, AllowedInstanceTypes: []string{"g5.xlarge"}}, "s-default", "s-b"),
		pool("batch", "batch", nil, "s-default"),
	}
}

// newFixture builds the operator's cluster (Cluster c1 and defaultPools in
// namespace ops) and a workload cluster holding pods; local says whether
// the two are the same cluster.
func newFixture(t *testing.T, local, paused bool, pods ...*corev1.Pod) fixture {
	return newFixtureWith(t, local, paused, defaultPools(), pods...)
}

func newFixtureWith(t *testing.T, local, paused bool, objs []client.Object, pods ...*corev1.Pod) fixture {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "c1"}}
	if paused {
		cluster.Spec.Paused = ptr.To(true)
	}
	op := fake.NewClientBuilder().WithScheme(s).WithObjects(append(objs, cluster)...).Build()
	b := fake.NewClientBuilder().WithScheme(s)
	for _, p := range pods {
		b = b.WithObjects(p)
	}
	wl := b.Build()
	rec := record.NewFakeRecorder(16)
	return fixture{
		r: &Reconciler{
			Client: op, Namespace: "ops", ClusterName: "c1", Namespaces: []string{"ops", "team-a"},
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

// requireRefused checks the one Warning Event of a refused pod and that it
// got nothing: no pair, no finalizer.
func (f fixture) requireRefused(t *testing.T, pod *corev1.Pod, want string) {
	t.Helper()
	f.requireNoPair(t, Name(pod))
	require.Len(t, f.recorder.Events, 1)
	ev := <-f.recorder.Events
	require.Contains(t, ev, corev1.EventTypeWarning+" "+ReasonRefused+" ")
	require.Contains(t, ev, want)
	var got corev1.Pod
	require.NoError(t, f.wl.Get(context.Background(), request(pod).NamespacedName, &got))
	require.NotContains(t, got.Finalizers, Finalizer, "a refused pod has nothing to clean up")
}

func TestRefusedPods(t *testing.T) {
	for _, tt := range []struct {
		name        string
		ns          string
		annotations map[string]string
		want        string
		recheck     bool
	}{
		{"namespace not allowed", "kube-public", map[string]string{AnnotationGroup: "web"}, `namespace "kube-public" may not ask`, false},
		{"no pool for the group", "ops", map[string]string{AnnotationGroup: "other-tenant-group"}, `no NstanceMachinePool with group "other-tenant-group"`, true},
		{"pool did not opt in", "ops", map[string]string{AnnotationGroup: "batch"}, "spec.onDemand.enabled is not true", true},
		{"instance type not allowed", "team-a", map[string]string{AnnotationGroup: "web", AnnotationInstanceType: "p5.48xlarge"}, `instance type "p5.48xlarge" is not allowed`, true},
		{"shard outside the pool's shards", "ops", map[string]string{AnnotationGroup: "web", AnnotationShard: "s-elsewhere"}, `shard "s-elsewhere" is not one of`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := annotatedPod(tt.ns, tt.annotations)
			f := newFixture(t, true, false, pod)
			f.r.Recheck = 7 * time.Second
			res, err := f.r.Reconcile(context.Background(), request(pod))
			require.NoError(t, err)
			if tt.recheck {
				require.Equal(t, reconcile.Result{RequeueAfter: 7 * time.Second}, res, "looked at again: the pool may change")
			} else {
				require.Equal(t, reconcile.Result{}, res)
			}
			f.requireRefused(t, pod, tt.want)
		})
	}
}

func TestDefaultNamespaceIsTheOperators(t *testing.T) {
	ctx := context.Background()
	inOps := annotatedPod("ops", map[string]string{AnnotationGroup: "web"})
	elsewhere := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "job-2", UID: "5678", Annotations: map[string]string{AnnotationGroup: "web"}}}
	f := newFixture(t, true, false, inOps, elsewhere)
	f.r.Namespaces = nil
	_, err := f.r.Reconcile(ctx, request(elsewhere))
	require.NoError(t, err)
	f.requireRefused(t, elsewhere, "(allowed namespaces: ops;")
	_, err = f.r.Reconcile(ctx, request(inOps))
	require.NoError(t, err)
	f.pair(t, Name(inOps))
}

// onDemandMachine is an existing on-demand NstanceMachine of group.
func onDemandMachine(name, group string) *infrav1.NstanceMachine {
	return &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name,
			Labels: map[string]string{clusterv1.ClusterNameLabel: "c1", LabelPodNamespace: "ops", LabelPodName: name}},
		Spec: infrav1.NstanceMachineSpec{Group: group},
	}
}

func TestMaxInstances(t *testing.T) {
	ctx := context.Background()
	objs := []client.Object{
		pool("gpu", "gpu", &infrav1.OnDemandSpec{Enabled: true, MaxInstances: ptr.To[int32](2)}, "s-default", "s-b"),
		// One on-demand instance of gpu on another shard already.
		onDemandMachine("od-earlier", "gpu"),
		// Neither another group's on-demand instance nor the pool's own
		// replicas count.
		onDemandMachine("od-other", "web"),
		&infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "gpu-member",
			Labels: map[string]string{clusterv1.ClusterNameLabel: "c1"}}, Spec: infrav1.NstanceMachineSpec{Group: "gpu"}},
	}
	first := annotatedPod("ops", map[string]string{AnnotationGroup: "gpu", AnnotationShard: "s-b"})
	second := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "job-2", UID: "5678", Annotations: map[string]string{AnnotationGroup: "gpu"}}}
	f := newFixtureWith(t, true, false, objs, first, second)

	_, err := f.r.Reconcile(ctx, request(first))
	require.NoError(t, err)
	f.pair(t, Name(first))
	require.Contains(t, <-f.recorder.Events, ReasonCreated)

	res, err := f.r.Reconcile(ctx, request(second))
	require.NoError(t, err)
	require.Equal(t, DefaultRecheck, res.RequeueAfter)
	f.requireRefused(t, second, "NstanceMachinePool gpu has 2 on-demand instances, spec.onDemand.maxInstances is 2")

	// The first pod's own pair does not count against it.
	_, err = f.r.Reconcile(ctx, request(first))
	require.NoError(t, err)
	require.Empty(t, f.recorder.Events)

	// One goes: the refused pod gets its instance on the next look.
	require.NoError(t, f.op.Delete(ctx, &infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "od-earlier"}}))
	_, err = f.r.Reconcile(ctx, request(second))
	require.NoError(t, err)
	nm, _ := f.pair(t, Name(second))
	require.Equal(t, "s-default", nm.Spec.Shard, "the pool's first shard")
}

func TestAdmittedPairKeepsWhatWasAdmitted(t *testing.T) {
	ctx := context.Background()
	pod := annotatedPod("ops", map[string]string{AnnotationGroup: "gpu", AnnotationInstanceType: "g5.xlarge"})
	f := newFixture(t, true, false, pod)
	_, err := f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	<-f.recorder.Events

	// The pod's owner changes its mind after the admission.
	var got corev1.Pod
	require.NoError(t, f.wl.Get(ctx, request(pod).NamespacedName, &got))
	got.Annotations[AnnotationInstanceType] = "p5.48xlarge"
	require.NoError(t, f.wl.Update(ctx, &got))
	// The Machine went missing meanwhile: it comes back, from the
	// NstanceMachine's spec.
	require.NoError(t, f.op.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: Name(pod)}}))
	_, err = f.r.Reconcile(ctx, request(pod))
	require.NoError(t, err)
	nm, m := f.pair(t, Name(pod))
	require.Equal(t, "g5.xlarge", nm.Spec.InstanceType)
	require.Equal(t, "s-default", m.Spec.FailureDomain)
	require.Empty(t, f.recorder.Events)
}
