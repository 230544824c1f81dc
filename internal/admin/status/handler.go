package status

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/nstance-dev/nstance/internal/admin/adminserve"
)

//go:embed page.html
var page []byte

// Handler serves the status page:
//
//	GET /                    the page (HTML, script and style inline)
//	GET /v1/status           the snapshot as JSON
//	GET /v1/status/events    server-sent events: a "snapshot" event now and at every change
//
// keepAlive is how often an idle event stream gets a comment line (so
// proxies keep it open); 15s when zero.
func Handler(c *Collector, keepAlive time.Duration) http.Handler {
	if keepAlive <= 0 {
		keepAlive = 15 * time.Second
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		s, _, _ := c.Snapshot()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s)
	})
	mux.HandleFunc("GET /v1/status/events", func(w http.ResponseWriter, r *http.Request) {
		events(w, r, c, keepAlive)
	})
	return adminserve.JSONErrors(mux)
}

func events(w http.ResponseWriter, r *http.Request, c *Collector, keepAlive time.Duration) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	var sent uint64
	first := true
	for {
		s, v, next := c.Snapshot()
		if first || v != sent {
			b, err := json.Marshal(s)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "event: snapshot\nid: %d\ndata: %s\n\n", v, b); err != nil {
				return
			}
			fl.Flush()
			sent, first = v, false
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.stopped:
			return
		case <-next:
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}
