// Package healthz serves the agent's GET /healthz (NSTANCE_HEALTH_ADDR), the
// endpoint load balancers health-check and, in our tests, send traffic to.
// It answers 200 while the agent runs and 503 once it is stopping, with the
// instance id and the number of requests it has served, so a client can
// tell which instance answered and the agent's own count of its requests.
package healthz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Answer is the JSON body of /healthz.
type Answer struct {
	Status     string `json:"status"` // "ok" or "stopping"
	InstanceID string `json:"instance_id"`
	// Served counts the /healthz requests this agent answered, this one
	// included.
	Served int64 `json:"served"`
}

// Server is the /healthz endpoint of one agent.
type Server struct {
	InstanceID string
	Log        logr.Logger

	served   atomic.Int64
	stopping atomic.Bool
}

// Served returns how many requests the endpoint answered.
func (s *Server) Served() int64 { return s.served.Load() }

// ServeHTTP answers GET and HEAD /healthz.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/healthz" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	a := Answer{Status: "ok", InstanceID: s.InstanceID, Served: s.served.Add(1)}
	code := http.StatusOK
	if s.stopping.Load() {
		a.Status, code = "stopping", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(a)
}

// Listen binds addr; Serve then answers on it.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health endpoint %s: %w", addr, err)
	}
	return ln, nil
}

// Serve answers on ln until ctx ends; then it answers 503 to what is
// still in flight and closes within a second.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		s.stopping.Store(true)
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	s.Log.Info("serving /healthz", "addr", ln.Addr().String())
	err := srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("health endpoint: %w", err)
}
