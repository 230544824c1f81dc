package nodedrain

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func pod(name string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func ownedBy(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "x", UID: "u", Controller: ptr.To(true)}}
	}
}

// ownedByGoneDaemonSet makes p a pod of a DaemonSet that does not exist.
func ownedByGoneDaemonSet(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "deleted", UID: "d", Controller: ptr.To(true)}}
}

func phase(ph corev1.PodPhase) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Phase = ph }
}

func mirror(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"} }

func terminating(p *corev1.Pod) {
	p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	p.Finalizers = []string{"example.com/hold"}
}

func emptyDir(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
}

// dsX is the DaemonSet ownedBy("DaemonSet") pods belong to.
var dsX = &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "x", UID: "u"}}

// filterCase is one row of a single filter's table: the action it returns.
type filterCase struct {
	name string
	pod  *corev1.Pod
	want Action
}

func runFilter(t *testing.T, f Filter, cases []filterCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			d := f(context.Background(), tt.pod)
			require.Equal(t, tt.want, d.Action, d.Reason)
			require.NoError(t, d.Err)
			if d.Action != Continue {
				require.NotEmpty(t, d.Reason, "a decision says why")
			}
		})
	}
}

func TestMirrorPods(t *testing.T) {
	runFilter(t, MirrorPods, []filterCase{
		{"mirror pod", pod("a", mirror), Skip},
		{"terminating mirror pod", pod("a", mirror, terminating), Skip},
		{"plain pod", pod("a"), Continue},
		{"other annotations", pod("a", func(p *corev1.Pod) { p.Annotations = map[string]string{"x": "y"} }), Continue},
	})
}

func TestFinishedPods(t *testing.T) {
	runFilter(t, FinishedPods, []filterCase{
		{"succeeded", pod("a", phase(corev1.PodSucceeded)), Skip},
		{"failed", pod("a", phase(corev1.PodFailed)), Skip},
		{"running", pod("a"), Continue},
		{"pending", pod("a", phase(corev1.PodPending)), Continue},
		{"unknown", pod("a", phase(corev1.PodUnknown)), Continue},
	})
}

func TestTerminatingPods(t *testing.T) {
	runFilter(t, TerminatingPods, []filterCase{
		{"terminating", pod("a", terminating), Wait},
		{"running", pod("a"), Continue},
	})
}

func TestDaemonSets(t *testing.T) {
	cl := fake.NewClientBuilder().WithObjects(dsX.DeepCopy()).Build()
	runFilter(t, NewDaemonSets(cl).Filter, []filterCase{
		{"pod of an existing DaemonSet", pod("a", ownedBy("DaemonSet")), Skip},
		{"pod of a DaemonSet that is gone", pod("a", ownedByGoneDaemonSet), Continue},
		{"DaemonSet named by a non-controller reference", pod("a", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "x", UID: "u"}}
		}), Continue},
		{"ReplicaSet pod", pod("a", ownedBy("ReplicaSet")), Continue},
		{"unmanaged pod", pod("a"), Continue},
		{"DaemonSet of the same name in another namespace", pod("a", ownedBy("DaemonSet"), func(p *corev1.Pod) { p.Namespace = "other" }), Continue},
	})

	t.Run("looked up once per DaemonSets", func(t *testing.T) {
		gets := 0
		counting := fake.NewClientBuilder().WithObjects(dsX.DeepCopy()).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				gets++
				return c.Get(ctx, key, obj, opts...)
			},
		}).Build()
		f := NewDaemonSets(counting).Filter
		for range 3 {
			require.Equal(t, Skip, f(context.Background(), pod("a", ownedBy("DaemonSet"))).Action)
			require.Equal(t, Continue, f(context.Background(), pod("b", ownedByGoneDaemonSet)).Action)
		}
		require.Equal(t, 2, gets, "one lookup per DaemonSet, found or not")
	})

	t.Run("lookup failure fails the pod, neither skipped nor evicted", func(t *testing.T) {
		failing := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "x", errors.New("no"))
			},
		}).Build()
		d := NewDaemonSets(failing).Filter(context.Background(), pod("a", ownedBy("DaemonSet")))
		require.Equal(t, Fail, d.Action)
		require.ErrorContains(t, d.Err, "look up DaemonSet default/x of pod a")
		require.True(t, apierrors.IsForbidden(d.Err), "the cause is wrapped")
	})
}

// TestDecide covers the rules together, in the order Helper.Filters
// applies them: what a drain does with each kind of pod.
func TestDecide(t *testing.T) {
	cl := fake.NewClientBuilder().WithObjects(dsX.DeepCopy()).Build()
	h := &Helper{Reader: cl}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Action
	}{
		{"plain running pod (no controller)", pod("a"), Evict},
		{"pending pod", pod("a", phase(corev1.PodPending)), Evict},
		{"ReplicaSet pod", pod("a", ownedBy("ReplicaSet")), Evict},
		{"pod with an emptyDir volume", pod("a", emptyDir), Evict},
		{"DaemonSet pod", pod("a", ownedBy("DaemonSet")), Skip},
		{"pod of a DaemonSet that is gone", pod("a", ownedByGoneDaemonSet), Evict},
		{"mirror pod", pod("a", mirror), Skip},
		{"succeeded pod", pod("a", phase(corev1.PodSucceeded)), Skip},
		{"failed pod", pod("a", phase(corev1.PodFailed)), Skip},
		{"terminating pod", pod("a", terminating), Wait},
		{"terminating mirror pod", pod("a", mirror, terminating), Skip},
		{"terminating DaemonSet pod", pod("a", ownedBy("DaemonSet"), terminating), Skip},
		{"terminating finished pod", pod("a", phase(corev1.PodSucceeded), terminating), Skip},
		{"terminating pod of a DaemonSet that is gone", pod("a", ownedByGoneDaemonSet, terminating), Wait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(context.Background(), tt.pod, h.Filters())
			require.Equal(t, tt.want, d.Action, d.Reason)
			require.NoError(t, d.Err)
		})
	}

	t.Run("first decision wins", func(t *testing.T) {
		calls := 0
		count := func(context.Context, *corev1.Pod) Decision { calls++; return Decision{} }
		skip := func(context.Context, *corev1.Pod) Decision { return Decision{Action: Skip, Reason: "s"} }
		d := Decide(context.Background(), pod("a"), []Filter{count, skip, count})
		require.Equal(t, Skip, d.Action)
		require.Equal(t, 1, calls, "filters after the deciding one do not run")
		require.Equal(t, Evict, Decide(context.Background(), pod("a"), nil).Action, "no filters: evict")
	})
}
