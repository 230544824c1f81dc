package spot

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// fakeGCE is a Google Cloud metadata server: the values by path (absent:
// 404), the Metadata-Flavor header required both ways.
type fakeGCE struct {
	mu     sync.Mutex
	values map[string]string
	reads  map[string]int
	flavor string // the answer's Metadata-Flavor ("Google")
}

func newFakeGCE(t *testing.T, values map[string]string) (*fakeGCE, string) {
	f := &fakeGCE{values: values, reads: map[string]int{}, flavor: "Google"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "no flavor", http.StatusForbidden)
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		p := r.URL.Path[len("/computeMetadata/v1/"):]
		f.reads[p]++
		v, ok := f.values[p]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Metadata-Flavor", f.flavor)
		_, _ = w.Write([]byte(v))
	}))
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeGCE) set(path, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[path] = v
}

func TestGCPLifeCycle(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		values map[string]string
		want   string
	}{
		{"spot", map[string]string{GCPModelPath: "SPOT"}, "spot"},
		{"standard", map[string]string{GCPModelPath: "STANDARD"}, "on-demand"},
		{"legacy preemptible", map[string]string{GCPLegacyPath: "TRUE"}, "spot"},
		{"legacy standard", map[string]string{GCPLegacyPath: "FALSE"}, "on-demand"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := newFakeGCE(t, tc.values)
			got, err := (&GCP{Endpoint: url}).LifeCycle(ctx)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	f, url := newFakeGCE(t, map[string]string{GCPModelPath: "SPOT"})
	f.flavor = ""
	_, err := (&GCP{Endpoint: url}).LifeCycle(ctx)
	require.ErrorContains(t, err, "not the Google metadata server's", "another metadata server answering is not GCE's")
}

// The watcher detects a spot VM, polls instance/preempted, and reports the
// preemption with the 30s deadline once it turns TRUE.
func TestGCPWatcherReportsPreemption(t *testing.T) {
	f, url := newFakeGCE(t, map[string]string{GCPModelPath: "SPOT", GCPPreemptedPath: "FALSE"})
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	w := &Watcher{Source: &GCP{Endpoint: url, Now: func() time.Time { return now }}, Detect: true, Interval: 5 * time.Millisecond, Log: testr.New(t)}
	notified := make(chan struct{})
	w.Notified = func() { close(notified) }
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	require.Eventually(t, func() bool { return w.Polls() >= 3 }, 10*time.Second, time.Millisecond)
	require.Nil(t, w.Notice(), "FALSE is no notice")
	f.set(GCPPreemptedPath, "TRUE")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no notice")
	}
	<-notified
	n := w.Notice()
	require.Equal(t, nstancev1.TerminationKind_TERMINATION_KIND_SPOT, n.GetKind())
	require.Equal(t, now.Add(GCPNoticeLead), n.GetDeadline().AsTime())
}

// A standard VM is not watched.
func TestGCPWatcherSkipsStandardVMs(t *testing.T) {
	f, url := newFakeGCE(t, map[string]string{GCPModelPath: "STANDARD", GCPPreemptedPath: "TRUE"})
	w := &Watcher{Source: &GCP{Endpoint: url}, Detect: true, Interval: time.Millisecond, Log: testr.New(t)}
	w.Run(context.Background())
	require.Nil(t, w.Notice())
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Zero(t, f.reads[GCPPreemptedPath])
	require.Equal(t, 1, f.reads[GCPModelPath])
}

func TestGCPNoticeRejectsGarbage(t *testing.T) {
	_, url := newFakeGCE(t, map[string]string{GCPPreemptedPath: "maybe"})
	_, err := (&GCP{Endpoint: url}).Notice(context.Background())
	require.ErrorContains(t, err, "want TRUE or FALSE")
}
