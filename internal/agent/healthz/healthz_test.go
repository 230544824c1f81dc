package healthz_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/healthz"
)

func TestHealthz(t *testing.T) {
	ln, err := healthz.Listen("127.0.0.1:0")
	require.NoError(t, err)
	s := &healthz.Server{InstanceID: "web-0a0b0c0d", Log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, healthz.Answer) {
		resp, err := http.Get(base + path) //nolint:noctx // a test's plain request
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		var a healthz.Answer
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
		}
		return resp.StatusCode, a
	}
	for i := int64(1); i <= 3; i++ {
		code, a := get("/healthz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, healthz.Answer{Status: "ok", InstanceID: "web-0a0b0c0d", Served: i}, a)
	}
	code, _ := get("/other")
	require.Equal(t, http.StatusNotFound, code)
	resp, err := http.Post(base+"/healthz", "text/plain", nil) //nolint:noctx // a test's plain request
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, int64(3), s.Served(), "only answered health requests count")

	// A stopping agent answers 503 to what is in flight, then closes.
	rec := &recorder{header: http.Header{}}
	cancel()
	require.NoError(t, <-done)
	req, err := http.NewRequest(http.MethodGet, "/healthz", nil)
	require.NoError(t, err)
	s.ServeHTTP(rec, req)
	require.Equal(t, http.StatusServiceUnavailable, rec.code)
	_, err = http.Get(base + "/healthz") //nolint:noctx,bodyclose // the listener is closed: no response
	require.Error(t, err)

	_, err = healthz.Listen("127.0.0.1:bad")
	require.ErrorContains(t, err, "health endpoint 127.0.0.1:bad")
}

type recorder struct {
	header http.Header
	code   int
	body   []byte
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(b []byte) (int, error) { r.body = append(r.body, b...); return len(b), nil }
