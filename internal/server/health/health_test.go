package health

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
	srv := httptest.NewServer(Handler(&r, reg))
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
	srv := httptest.NewServer(Handler(&r, nil, Check{Name: "storage", Func: check}))
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
