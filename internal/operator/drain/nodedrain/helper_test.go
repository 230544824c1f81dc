package nodedrain

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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nstance-dev/nstance/internal/operator/metrics"
)

// evictionServer answers eviction POSTs with the status configured per pod
// name (201 when none) and records which pods were asked for.
type evictionServer struct {
	mu     sync.Mutex
	codes  map[string]int
	asked  []string
	client client.Client
	// deleteOnEvict removes an evicted pod (grace period zero).
	deleteOnEvict bool
	// release, when set, holds every eviction until a value is received
	// from it; inFlight and maxInFlight count the held ones.
	release     chan struct{}
	inFlight    int
	maxInFlight int
	started     int
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
	s.started++
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	if s.release != nil {
		<-s.release
	}
	s.mu.Lock()
	s.inFlight--
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

// cluster is the part of a workload cluster a Helper uses.
type cluster struct {
	client client.Client
	policy rest.Interface
}

func helperFor(wl *cluster, evictionsPerNode int) *Helper {
	return &Helper{Client: wl.client, Reader: wl.client, Policy: wl.policy, EvictionsPerNode: evictionsPerNode}
}

// newCluster returns a workload cluster backed by the fake client (pods
// listed by spec.nodeName) and the eviction server.
func newCluster(t *testing.T, codes map[string]int, deleteOnEvict bool, pods ...*corev1.Pod) (*cluster, *evictionServer) {
	t.Helper()
	b := fake.NewClientBuilder().WithIndex(&corev1.Pod{}, PodNodeNameField, func(o client.Object) []string {
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
	return &cluster{client: cl, policy: policy}, srv
}

func TestPassSkipsAndCounts(t *testing.T) {
	other := pod("elsewhere", func(p *corev1.Pod) { p.Spec.NodeName = "n2" })
	wl, srv := newCluster(t, nil, true,
		pod("web"),
		pod("ds", ownedBy("DaemonSet")),
		pod("orphan-ds", ownedByGoneDaemonSet),
		pod("mirror", mirror),
		pod("done", phase(corev1.PodSucceeded)),
		pod("crashed", phase(corev1.PodFailed)),
		pod("terminating", terminating), other,
	)
	remaining, blocked, err := helperFor(wl, 0).Pass(context.Background(), "n1")
	require.NoError(t, err)
	require.Empty(t, blocked)
	// web and the pod of a DaemonSet that is gone were evicted (and deleted
	// at once); the terminating pod still holds the node; pods of an
	// existing DaemonSet, mirror and finished pods never count.
	require.Equal(t, 1, remaining)
	require.Equal(t, []string{"default/orphan-ds", "default/web"}, srv.askedFor(), "only evictable pods not yet terminating are evicted")
}

func TestPassNotFoundCountsAsGone(t *testing.T) {
	// The eviction answers 404 while the (lagging) list still shows the pod.
	wl, srv := newCluster(t, map[string]int{"gone": http.StatusNotFound}, false, pod("gone"))
	remaining, blocked, err := helperFor(wl, 0).Pass(context.Background(), "n1")
	require.NoError(t, err)
	require.Empty(t, blocked)
	require.Equal(t, 0, remaining, "a pod whose eviction answers 404 is gone")
	require.Equal(t, []string{"default/gone"}, srv.askedFor())
}

func TestPassTooManyRequestsIsBlocked(t *testing.T) {
	wl, _ := newCluster(t, map[string]int{"guarded-b": http.StatusTooManyRequests, "guarded-a": http.StatusTooManyRequests}, true,
		pod("guarded-b"), pod("guarded-a"), pod("free"))
	remaining, blocked, err := helperFor(wl, 1).Pass(context.Background(), "n1")
	require.NoError(t, err, "a PodDisruptionBudget refusal is no error")
	require.Equal(t, []string{"default/guarded-a", "default/guarded-b"}, blocked, "refused pods are reported, sorted")
	require.Equal(t, 3, remaining, "refused pods still count")

	// The next pass retries the refused pods; once the budget allows, they go.
	wl2, srv2 := newCluster(t, nil, true, pod("guarded-b"), pod("guarded-a"))
	remaining, blocked, err = helperFor(wl2, 1).Pass(context.Background(), "n1")
	require.NoError(t, err)
	require.Empty(t, blocked)
	require.Equal(t, 0, remaining)
	require.Equal(t, []string{"default/guarded-a", "default/guarded-b"}, srv2.askedFor())
}

func TestPassOtherErrorsAreReported(t *testing.T) {
	wl, _ := newCluster(t, map[string]int{"bad": http.StatusInternalServerError}, true, pod("bad"), pod("fine"))
	remaining, blocked, err := helperFor(wl, 0).Pass(context.Background(), "n1")
	require.ErrorContains(t, err, "evict pod default/bad")
	require.Empty(t, blocked)
	require.Equal(t, 2, remaining, "with an error the pass does not recount")
}

func TestOutcome(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"accepted", nil, metrics.EvictionEvicted},
		{"pod gone (404)", apierrors.NewNotFound(gr, "a"), metrics.EvictionGone},
		{"refused by a PodDisruptionBudget (429)", apierrors.NewTooManyRequests("budget", 0), metrics.EvictionBlocked},
		{"server error", apierrors.NewInternalError(errors.New("boom")), metrics.EvictionError},
		{"forbidden", apierrors.NewForbidden(gr, "a", errors.New("no")), metrics.EvictionError},
		{"transport error", errors.New("connection refused"), metrics.EvictionError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Outcome(tt.err))
		})
	}
}

func TestCordon(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	patches := 0
	cl := fake.NewClientBuilder().WithObjects(node.DeepCopy()).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches++
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	h := &Helper{Client: cl}
	var got corev1.Node
	require.NoError(t, cl.Get(context.Background(), client.ObjectKey{Name: "n1"}, &got))
	require.NoError(t, h.Cordon(context.Background(), &got))
	require.True(t, got.Spec.Unschedulable)
	var stored corev1.Node
	require.NoError(t, cl.Get(context.Background(), client.ObjectKey{Name: "n1"}, &stored))
	require.True(t, stored.Spec.Unschedulable, "the cordon is written")
	require.Equal(t, 1, patches)

	require.NoError(t, h.Cordon(context.Background(), &stored))
	require.Equal(t, 1, patches, "a cordoned Node is not patched again")

	missing := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone"}}
	require.ErrorContains(t, h.Cordon(context.Background(), missing), "cordon Node gone")
}

func TestPassBoundsEvictionsInFlight(t *testing.T) {
	const pods, limit = 5, 2
	var list []*corev1.Pod
	for _, n := range []string{"a", "b", "c", "d", "e"}[:pods] {
		list = append(list, pod(n))
	}
	wl, srv := newCluster(t, nil, true, list...)
	srv.release = make(chan struct{})
	type result struct {
		remaining int
		err       error
	}
	done := make(chan result, 1)
	go func() {
		remaining, _, err := helperFor(wl, limit).Pass(context.Background(), "n1")
		done <- result{remaining, err}
	}()
	// Each step waits until as many evictions as the limit allows are held
	// (so they do go out concurrently), then lets one finish.
	for i := range pods {
		wantStarted, wantInFlight := min(pods, i+limit), min(limit, pods-i)
		require.Eventually(t, func() bool {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			return srv.started == wantStarted && srv.inFlight == wantInFlight
		}, 10*time.Second, time.Millisecond, "step %d", i)
		srv.release <- struct{}{}
	}
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, 0, r.remaining)
	require.Equal(t, limit, srv.maxInFlight, "never more than EvictionsPerNode at once")
}

func TestPassDaemonSetLookupFailure(t *testing.T) {
	wl, srv := newCluster(t, nil, true, pod("ds", ownedBy("DaemonSet")), pod("web"))
	failing := interceptor.NewClient(wl.client.(client.WithWatch), interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "x", errors.New("no"))
		},
	})
	h := &Helper{Client: failing, Reader: failing, Policy: wl.policy}
	remaining, blocked, err := h.Pass(context.Background(), "n1")
	require.ErrorContains(t, err, "look up DaemonSet default/x of pod ds")
	require.Empty(t, blocked)
	// The undecided pod holds the node, and with an error the pass does
	// not recount: the evicted one counts until the next pass.
	require.Equal(t, 2, remaining)
	require.Equal(t, []string{"default/web"}, srv.askedFor(), "the undecided pod is not evicted, the others are")
}
