package health

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestHealth(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nstance_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	var r Readiness
	srv := httptest.NewServer(Handler(&r, Metrics{Full: reg, Public: reg}))
	t.Cleanup(srv.Close)

	steps := []struct {
		name         string
		config, sync bool
		want         int
	}{
		{"nothing", false, false, 503},
		{"config only", true, false, 503},
		{"cache only", false, true, 503},
		{"both", true, true, 200},
	}
	for _, s := range steps {
		r.SetConfigLoaded(s.config)
		r.SetCacheSynced(s.sync)
		code, body := get(t, srv.URL+"/health")
		require.Equal(t, s.want, code, s.name)
		var rep report
		require.NoError(t, json.Unmarshal([]byte(body), &rep))
		require.Equal(t, s.config, rep.ConfigLoaded)
	}
	code, body := get(t, srv.URL+"/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, "nstance_test_total 1")
}

func TestElectionHandler(t *testing.T) {
	state := ElectionState{ServerID: "a", Shard: "s1"}
	srv := httptest.NewServer(ElectionHandler(func() ElectionState { return state }))
	t.Cleanup(srv.Close)
	code, _ := get(t, srv.URL+"/health")
	require.Equal(t, 503, code)
	state.ShardLeader = true
	code, body := get(t, srv.URL+"/health")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"shard_leader":true`)
}

// TestProbes: /healthz answers 200 whatever the readiness conditions;
// /readyz needs the config, the cache and every check, and names the
// failing check.
func TestProbes(t *testing.T) {
	var r Readiness
	var storageErr atomic.Pointer[error]
	check := func() error {
		if p := storageErr.Load(); p != nil {
			return *p
		}
		return nil
	}
	srv := httptest.NewServer(Handler(&r, Metrics{}, Check{Name: "storage", Func: check}))
	defer srv.Close()

	code, _ := get(t, srv.URL+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "starting: no config, no cache")

	r.SetConfigLoaded(true)
	r.SetCacheSynced(true)
	code, body := get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"status":"ready","config_loaded":true,"cache_synced":true,"checks":{"storage":"ok"}}`, body)

	e := errors.New("storage last answered 9s ago")
	storageErr.Store(&e)
	code, body = get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"not ready","config_loaded":true,"cache_synced":true,"checks":{"storage":"storage last answered 9s ago"}}`, body)
	code, _ = get(t, srv.URL+"/healthz")
	require.Equal(t, http.StatusOK, code, "liveness does not follow readiness checks")
	code, _ = get(t, srv.URL+"/health")
	require.Equal(t, http.StatusOK, code, "/health keeps its config-and-cache meaning")
}

// TestMetricsViews: without credentials /metrics serves the public view;
// the bearer token of the token file gets the full one; any other
// credentials get 401, and so does every bearer without a token file.
func TestMetricsViews(t *testing.T) {
	full, public := prometheus.NewRegistry(), prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nstance_test_instances", Help: "test"}, []string{"tenant"})
	g.WithLabelValues("acme").Set(3)
	full.MustRegister(g)
	public.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "nstance_test_instances", Help: "test"}))
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600))
	var r Readiness
	srv := httptest.NewServer(Handler(&r, Metrics{Full: full, Public: public, TokenFile: tokenFile}))
	t.Cleanup(srv.Close)
	scrape := func(auth string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := scrape("")
	require.Equal(t, 200, code)
	require.Contains(t, body, "nstance_test_instances 0")
	require.NotContains(t, body, "acme")
	code, body = scrape("Bearer s3cret")
	require.Equal(t, 200, code)
	require.Contains(t, body, `nstance_test_instances{tenant="acme"} 3`)
	for _, bad := range []string{"Bearer wrong", "Bearer ", "Basic czNjcmV0", "s3cret"} {
		code, body = scrape(bad)
		require.Equal(t, 401, code, bad)
		require.NotContains(t, body, "acme", bad)
	}
	// The file is read at each scrape: a rotated token takes effect at once.
	require.NoError(t, os.WriteFile(tokenFile, []byte("next"), 0o600))
	code, _ = scrape("Bearer s3cret")
	require.Equal(t, 401, code)
	code, _ = scrape("Bearer next")
	require.Equal(t, 200, code)

	// Without a token file only the public view exists.
	srv2 := httptest.NewServer(Handler(&r, Metrics{Full: full, Public: public}))
	t.Cleanup(srv2.Close)
	req, err := http.NewRequest(http.MethodGet, srv2.URL+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer next")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 401, resp.StatusCode)
}
