package spot

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeIMDS serves IMDSv2: a token from PUT /latest/api/token, required on
// every read; spot/instance-action answers 404 for the first notAfter
// polls, then the notice (or status/body when set).
type fakeIMDS struct {
	*httptest.Server
	notAfter int
	body     string
	// failFirst makes the first reads answer 500.
	failFirst int
	// tokenStatus, when set, is the answer to every token request (an IMDS
	// without IMDSv2, or one refusing tokens).
	tokenStatus int
	// lifeCycle is instance-life-cycle ("": 404).
	lifeCycle string

	mu     sync.Mutex
	tokens int
	polls  int // reads with the session token
	reads  int // every read of instance-action
	// lifeCycleReads counts reads of instance-life-cycle.
	lifeCycleReads int
	errs           []string
}

func newFakeIMDS(t *testing.T, notAfter int, body string) *fakeIMDS {
	t.Helper()
	f := &fakeIMDS{notAfter: notAfter, body: body}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		f.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, e := range f.errs {
			t.Error(e)
		}
	})
	return f
}

func (f *fakeIMDS) token(n int) string { return fmt.Sprintf("token-%d", n) }

func (f *fakeIMDS) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
		if r.Header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds") == "" {
			f.errs = append(f.errs, "token request without a TTL header")
			http.Error(w, "missing ttl", http.StatusBadRequest)
			return
		}
		if f.tokenStatus != 0 {
			w.WriteHeader(f.tokenStatus)
			return
		}
		f.tokens++
		w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
		_, _ = w.Write([]byte(f.token(f.tokens)))
	case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/instance-life-cycle":
		f.lifeCycleReads++
		if f.tokens == 0 || r.Header.Get("X-Aws-Ec2-Metadata-Token") != f.token(f.tokens) {
			f.errs = append(f.errs, "metadata read without the session token (IMDSv1)")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if f.lifeCycle == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(f.lifeCycle))
	case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/spot/instance-action":
		f.reads++
		if f.tokens == 0 || r.Header.Get("X-Aws-Ec2-Metadata-Token") != f.token(f.tokens) {
			f.errs = append(f.errs, "metadata read without the session token (IMDSv1)")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		f.polls++
		if f.polls <= f.failFirst {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if f.polls <= f.notAfter {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(f.body))
	default:
		f.errs = append(f.errs, "unexpected request "+r.Method+" "+r.URL.Path)
		http.NotFound(w, r)
	}
}

// readCount is the number of metadata reads, with or without a token.
func (f *fakeIMDS) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

func (f *fakeIMDS) lifeCycleReadCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lifeCycleReads
}

func (f *fakeIMDS) counts() (tokens, polls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokens, f.polls
}
