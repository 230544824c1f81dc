package health

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness tracks the conditions /health reports.
type Readiness struct {
	configLoaded atomic.Bool
	cacheSynced  atomic.Bool
}

// SetConfigLoaded records whether a valid config is loaded.
func (r *Readiness) SetConfigLoaded(v bool) { r.configLoaded.Store(v) }

// SetCacheSynced records whether the cache has been built from storage.
func (r *Readiness) SetCacheSynced(v bool) { r.cacheSynced.Store(v) }

// Ready reports whether both conditions hold.
func (r *Readiness) Ready() bool { return r.configLoaded.Load() && r.cacheSynced.Load() }

type report struct {
	Status       string `json:"status"`
	ConfigLoaded bool   `json:"config_loaded"`
	CacheSynced  bool   `json:"cache_synced"`
	// Checks holds each further readiness check: "ok" or why it fails.
	Checks map[string]string `json:"checks,omitempty"`
}

// Check is a further readiness condition: Func returns nil while it holds.
type Check struct {
	Name string
	Func func() error
}

// Metrics is what GET /metrics serves. The health port is reachable by
// whatever may probe the server (a load balancer's health check, the
// cluster's Prometheus), so a scrape without credentials gets Public: the
// same series with no tenant or group named. A scrape presenting the bearer
// token in TokenFile gets Full.
type Metrics struct {
	// Full is every series, tenant and group labels included.
	Full prometheus.Gatherer
	// Public is what a scrape without an Authorization header gets.
	Public prometheus.Gatherer
	// TokenFile names a file holding the bearer token of a full scrape,
	// read at each such scrape (so it can be rotated in place); empty: a
	// scrape with credentials is refused.
	TokenFile string
}

// Handler serves the probes and /metrics:
//
//	GET /healthz   liveness: 200 while the process serves HTTP at all; it
//	               never depends on storage or leadership, so an outage of
//	               either does not get the server restarted
//	GET /readyz    readiness: 200 once the config is loaded and the cache
//	               synced and while every check holds (storage answering),
//	               for the leader and a standby alike; 503 otherwise
//	GET /health    the config and cache conditions alone (the first
//	               probe; kept for the dev scripts and older manifests)
//	GET /metrics   m.Public without credentials; m.Full with
//	               "Authorization: Bearer <the token in m.TokenFile>";
//	               401 with any other credentials (never the public view
//	               instead, so a wrong token shows)
func Handler(r *Readiness, m Metrics, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		rep := report{Status: "ok", ConfigLoaded: r.configLoaded.Load(), CacheSynced: r.cacheSynced.Load()}
		code := http.StatusOK
		if !r.Ready() {
			rep.Status, code = "starting", http.StatusServiceUnavailable
		}
		writeJSON(w, code, rep)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		rep := report{Status: "ready", ConfigLoaded: r.configLoaded.Load(), CacheSynced: r.cacheSynced.Load(), Checks: map[string]string{}}
		ok := r.Ready()
		for _, c := range checks {
			if err := c.Func(); err != nil {
				rep.Checks[c.Name], ok = err.Error(), false
			} else {
				rep.Checks[c.Name] = "ok"
			}
		}
		code := http.StatusOK
		if !ok {
			rep.Status, code = "not ready", http.StatusServiceUnavailable
		}
		writeJSON(w, code, rep)
	})
	if m.Public != nil && m.Full != nil {
		public := promhttp.HandlerFor(m.Public, promhttp.HandlerOpts{})
		full := promhttp.HandlerFor(m.Full, promhttp.HandlerOpts{})
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, req *http.Request) {
			auth := req.Header.Get("Authorization")
			switch {
			case auth == "":
				public.ServeHTTP(w, req)
			case m.bearerOK(auth):
				full.ServeHTTP(w, req)
			default:
				w.Header().Set("WWW-Authenticate", `Bearer realm="nstance-server metrics"`)
				http.Error(w, "metrics: bearer token not accepted (omit credentials for the public series)", http.StatusUnauthorized)
			}
		})
	}
	return mux
}

// bearerOK reports whether auth carries the token of m.TokenFile.
func (m Metrics) bearerOK(auth string) bool {
	got, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || m.TokenFile == "" {
		return false
	}
	want, err := os.ReadFile(m.TokenFile)
	if err != nil {
		return false
	}
	want = bytes.TrimSpace(want)
	return len(want) > 0 && subtle.ConstantTimeCompare(want, []byte(strings.TrimSpace(got))) == 1
}

// ElectionState is what the election port reports.
type ElectionState struct {
	ServerID      string `json:"server_id"`
	ClusterID     string `json:"cluster_id"`
	Shard         string `json:"shard"`
	ClusterLeader bool   `json:"cluster_leader"`
	ShardLeader   bool   `json:"shard_leader"`
	// Holders are the lease holders last seen in storage.
	ClusterLeaderHolder string `json:"cluster_leader_holder"`
	ShardLeaderHolder   string `json:"shard_leader_holder"`
	ShardTerm           int64  `json:"shard_term"`
}

// ElectionHandler serves GET /health (and /) on the election port: 200 with
// the state when this server leads the shard, 503 with the state otherwise.
func ElectionHandler(state func() ElectionState) http.Handler {
	mux := http.NewServeMux()
	h := func(w http.ResponseWriter, _ *http.Request) {
		s := state()
		code := http.StatusOK
		if !s.ShardLeader {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, s)
	}
	mux.HandleFunc("GET /health", h)
	mux.HandleFunc("GET /{$}", h)
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
