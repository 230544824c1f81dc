package drain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
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

func phase(ph corev1.PodPhase) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Phase = ph }
}

// dsX is the DaemonSet ownedBy("DaemonSet") pods belong to.
var dsX = &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "x", UID: "u"}}

func TestPodFilter(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		skip bool
	}{
		{"plain running pod", pod("a"), false},
		{"ReplicaSet pod", pod("a", ownedBy("ReplicaSet")), false},
		{"DaemonSet pod", pod("a", ownedBy("DaemonSet")), true},
		{"pod of a DaemonSet that is gone", pod("a", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "deleted", UID: "d", Controller: ptr.To(true)}}
		}), false},
		{"DaemonSet named by a non-controller reference", pod("a", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "x", UID: "u"}}
		}), false},
		{"mirror pod", pod("a", func(p *corev1.Pod) {
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
		}), true},
		{"succeeded pod", pod("a", phase(corev1.PodSucceeded)), true},
		{"failed pod", pod("a", phase(corev1.PodFailed)), true},
		{"pending pod", pod("a", phase(corev1.PodPending)), false},
	}
	cl := fake.NewClientBuilder().WithObjects(dsX.DeepCopy()).Build()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			skip, err := newPodFilter(cl).skip(context.Background(), tt.pod)
			require.NoError(t, err)
			require.Equal(t, tt.skip, skip)
		})
	}

	t.Run("DaemonSet looked up once per filter", func(t *testing.T) {
		gets := 0
		counting := fake.NewClientBuilder().WithObjects(dsX.DeepCopy()).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				gets++
				return c.Get(ctx, key, obj, opts...)
			},
		}).Build()
		f := newPodFilter(counting)
		for range 3 {
			skip, err := f.skip(context.Background(), pod("a", ownedBy("DaemonSet")))
			require.NoError(t, err)
			require.True(t, skip)
		}
		require.Equal(t, 1, gets)
	})

	t.Run("lookup failure is an error, not a skip or an eviction", func(t *testing.T) {
		failing := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "x", errors.New("no"))
			},
		}).Build()
		_, err := newPodFilter(failing).skip(context.Background(), pod("a", ownedBy("DaemonSet")))
		require.ErrorContains(t, err, "look up DaemonSet default/x of pod a")
	})
}

func TestAckSettled(t *testing.T) {
	for code, settled := range map[codes.Code]bool{
		codes.NotFound:           true,
		codes.Aborted:            true,
		codes.FailedPrecondition: true,
		codes.Unavailable:        false,
		codes.Internal:           false,
		codes.PermissionDenied:   false,
		codes.DeadlineExceeded:   false,
	} {
		require.Equal(t, settled, ackSettled(status.Error(code, "x")), code.String())
	}
	require.True(t, ackSettled(nil), "OK")
}

func TestVMGone(t *testing.T) {
	st := func(s nstancev1.InstanceState, gone bool) *nstancev1.InstanceStatus {
		return &nstancev1.InstanceStatus{State: s, WorkloadGone: gone}
	}
	require.True(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_STOPPED, false)))
	require.True(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_DELETED, false)))
	require.True(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, true)))
	require.False(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, false)))
	require.False(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_RUNNING, false)))
}

func TestRetryAfter(t *testing.T) {
	c := &Coordinator{RetryInterval: 3 * time.Second}
	require.Equal(t, 3*time.Second, c.retryAfter(drainState{}))
	require.Equal(t, 3*time.Second, c.retryAfter(drainState{deadline: time.Now().Add(time.Hour)}))
	// A deadline already passed: the next pass comes at once (but not with
	// a zero or negative delay, which would mean "no requeue").
	require.Equal(t, time.Millisecond, c.retryAfter(drainState{deadline: time.Now().Add(-time.Hour)}))
	require.Equal(t, 2*time.Second, (&Coordinator{}).retryAfter(drainState{}))
}

// evictionServer answers eviction POSTs with the status configured per pod
// name (201 when none) and records which pods were asked for.
type evictionServer struct {
	mu     sync.Mutex
	codes  map[string]int
	asked  []string
	client client.Client
	// deleteOnEvict removes an evicted pod (grace period zero).
	deleteOnEvict bool
}

func (s *evictionServer) roundTrip(req *http.Request) (*http.Response, error) {
	// /api/v1/namespaces/{ns}/pods/{name}/eviction
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	if req.Method != http.MethodPost || len(parts) != 7 || parts[6] != "eviction" {
		return respond(http.StatusBadRequest, metav1.StatusReasonBadRequest, "unexpected request "+req.Method+" "+req.URL.Path), nil
	}
	ns, name := parts[3], parts[5]
	s.mu.Lock()
	s.asked = append(s.asked, ns+"/"+name)
	code, ok := s.codes[name]
	s.mu.Unlock()
	if !ok {
		code = http.StatusCreated
	}
	switch code {
	case http.StatusCreated:
		if s.deleteOnEvict {
			if err := s.client.Delete(req.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
				return nil, err
			}
		}
		return respond(code, "", ""), nil
	case http.StatusNotFound:
		return respond(code, metav1.StatusReasonNotFound, "pods \""+name+"\" not found"), nil
	case http.StatusTooManyRequests:
		return respond(code, metav1.StatusReasonTooManyRequests, "Cannot evict pod as it would violate the pod's disruption budget."), nil
	default:
		return respond(code, metav1.StatusReasonInternalError, "boom"), nil
	}
}

func (s *evictionServer) askedFor() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]string(nil), s.asked...)
	slices.Sort(out)
	return out
}

func respond(code int, reason metav1.StatusReason, msg string) *http.Response {
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: int32(code)}
	if reason != "" {
		st.Status, st.Reason, st.Message = metav1.StatusFailure, reason, msg
	}
	body, _ := json.Marshal(st)
	return &http.Response{
		StatusCode: code,
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(bytes.NewReader(body)),
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newWorkload returns a workload cluster backed by the fake client (pods
// listed by spec.nodeName) and the eviction server.
func newWorkload(t *testing.T, codes map[string]int, deleteOnEvict bool, pods ...*corev1.Pod) (*workload.Cluster, *evictionServer) {
	t.Helper()
	b := fake.NewClientBuilder().WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	})
	b = b.WithObjects(dsX.DeepCopy())
	for _, p := range pods {
		b = b.WithObjects(p)
	}
	cl := b.Build()
	srv := &evictionServer{codes: codes, client: cl, deleteOnEvict: deleteOnEvict}
	policy, err := rest.RESTClientFor(&rest.Config{
		Host:      "https://workload.invalid",
		Transport: roundTripFunc(srv.roundTrip),
		ContentConfig: rest.ContentConfig{
			GroupVersion:         &schema.GroupVersion{Group: "policy", Version: "v1"},
			NegotiatedSerializer: scheme.Codecs.WithoutConversion(),
		},
	})
	require.NoError(t, err)
	return &workload.Cluster{Client: cl, Reader: cl, Policy: policy}, srv
}

var node1 = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}

func TestEvictPassSkipsAndCounts(t *testing.T) {
	terminating := pod("terminating", func(p *corev1.Pod) {
		p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
		p.Finalizers = []string{"example.com/hold"}
	})
	other := pod("elsewhere", func(p *corev1.Pod) { p.Spec.NodeName = "n2" })
	wl, srv := newWorkload(t, nil, true,
		pod("web"),
		pod("ds", ownedBy("DaemonSet")),
		pod("orphan-ds", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "deleted", UID: "d", Controller: ptr.To(true)}}
		}),
		pod("mirror", func(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "h"} }),
		pod("done", phase(corev1.PodSucceeded)),
		pod("crashed", phase(corev1.PodFailed)),
		terminating, other,
	)
	c := &Coordinator{}
	remaining, blocked, err := c.evictPass(context.Background(), wl, node1)
	require.NoError(t, err)
	require.Empty(t, blocked)
	// web and the pod of a DaemonSet that is gone were evicted (and deleted
	// at once); the terminating pod still holds the node; pods of an
	// existing DaemonSet, mirror and finished pods never count.
	require.Equal(t, 1, remaining)
	require.Equal(t, []string{"default/orphan-ds", "default/web"}, srv.askedFor(), "only evictable pods not yet terminating are evicted")
}

func TestEvictPassNotFoundCountsAsGone(t *testing.T) {
	// The eviction answers 404 while the (lagging) list still shows the pod.
	wl, srv := newWorkload(t, map[string]int{"gone": http.StatusNotFound}, false, pod("gone"))
	remaining, blocked, err := (&Coordinator{}).evictPass(context.Background(), wl, node1)
	require.NoError(t, err)
	require.Empty(t, blocked)
	require.Equal(t, 0, remaining, "a pod whose eviction answers 404 is gone")
	require.Equal(t, []string{"default/gone"}, srv.askedFor())
}

func TestEvictPassTooManyRequestsIsBlocked(t *testing.T) {
	wl, _ := newWorkload(t, map[string]int{"guarded-b": http.StatusTooManyRequests, "guarded-a": http.StatusTooManyRequests}, true,
		pod("guarded-b"), pod("guarded-a"), pod("free"))
	c := &Coordinator{EvictionsPerNode: 1}
	remaining, blocked, err := c.evictPass(context.Background(), wl, node1)
	require.NoError(t, err, "a PodDisruptionBudget refusal is no error")
	require.Equal(t, []string{"default/guarded-a", "default/guarded-b"}, blocked, "refused pods are reported, sorted")
	require.Equal(t, 3, remaining, "refused pods still count")

	// The next pass retries the refused pods; once the budget allows, they go.
	wl2, srv2 := newWorkload(t, nil, true, pod("guarded-b"), pod("guarded-a"))
	remaining, blocked, err = c.evictPass(context.Background(), wl2, node1)
	require.NoError(t, err)
	require.Empty(t, blocked)
	require.Equal(t, 0, remaining)
	require.Equal(t, []string{"default/guarded-a", "default/guarded-b"}, srv2.askedFor())
}

func TestEvictPassOtherErrorsAreReported(t *testing.T) {
	wl, _ := newWorkload(t, map[string]int{"bad": http.StatusInternalServerError}, true, pod("bad"), pod("fine"))
	remaining, blocked, err := (&Coordinator{}).evictPass(context.Background(), wl, node1)
	require.ErrorContains(t, err, "evict pod default/bad")
	require.Empty(t, blocked)
	require.Equal(t, 2, remaining, "with an error the pass does not recount")
}

func TestObserve(t *testing.T) {
	c := &Coordinator{drains: map[Key]*drainState{}, queue: make(chan event.TypedGenericEvent[Key], 8)}
	ctx := context.Background()
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	next := func() Key {
		t.Helper()
		select {
		case e := <-c.queue:
			return e.Object
		default:
			t.Fatal("nothing enqueued")
			return Key{}
		}
	}
	requireEmpty := func() {
		t.Helper()
		select {
		case e := <-c.queue:
			t.Fatalf("unexpected enqueue of %v", e.Object)
		default:
		}
	}

	// An event without an instance ID is ignored.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION})
	requireEmpty()
	require.Equal(t, 0, c.Pending())

	// Pending deletion: recorded under the event's shard and enqueued.
	c.Observe(ctx, "stream-shard", &nstancev1.InstanceEvent{
		Shard: "s1", InstanceId: "i-1", ProviderId: "nstance://s1/i-1", GroupId: "g",
		Status:        nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION,
		DrainDeadline: timestamppb.New(deadline),
	})
	key := Key{NamespacedName: client.ObjectKey{Namespace: "s1", Name: "i-1"}}
	require.Equal(t, key, next())
	st, ok := c.state(key)
	require.True(t, ok)
	require.Equal(t, "nstance://s1/i-1", st.providerID)
	require.Equal(t, "g", st.group)
	require.True(t, st.deadline.Equal(deadline))
	require.False(t, st.acked)

	// Deleting: the server stopped waiting; the drain stops, nothing enqueued.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-1", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING})
	requireEmpty()
	st, _ = c.state(key)
	require.True(t, st.acked)

	// Deleted: marked for cleanup and enqueued, keeping the provider ID.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-1", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED})
	require.Equal(t, key, next())
	st, _ = c.state(key)
	require.True(t, st.deleted)
	require.Equal(t, "nstance://s1/i-1", st.providerID)

	// Announced again after deletion (a new drain of a reused key): fresh state.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-1", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION})
	require.Equal(t, key, next())
	st, _ = c.state(key)
	require.False(t, st.deleted)
	require.False(t, st.acked)
	require.Empty(t, st.providerID)

	// Other statuses are ignored.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-2", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_UNSPECIFIED})
	requireEmpty()
	require.Equal(t, 1, c.Pending())
}
