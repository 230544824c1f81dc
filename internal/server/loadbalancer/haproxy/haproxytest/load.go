package haproxytest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Answer is one response the load generator got: which agent answered
// (its /healthz instance_id) and that agent's own count of requests served.
type Answer struct {
	Sent     time.Time
	Instance string
	Served   int64
}

// Load sends GET requests to an agent /healthz URL behind a load balancer
// from a few workers until halted, keeping every answer and every failure.
type Load struct {
	url  string
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  []Answer
	errs []string
}

// StartLoad starts workers sending to url, each pausing 5 ms between
// requests so the load leaves the shared machine some CPU.
func StartLoad(url string, workers int) *Load {
	g := &Load{url: url, stop: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second}
	for range workers {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for {
				select {
				case <-g.stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				sent := time.Now()
				a, err := g.once(client)
				g.mu.Lock()
				if err != nil {
					g.errs = append(g.errs, err.Error())
				} else {
					a.Sent = sent
					g.got = append(g.got, a)
				}
				g.mu.Unlock()
			}
		}()
	}
	return g
}

func (g *Load) once(client *http.Client) (Answer, error) {
	resp, err := client.Get(g.url) //nolint:noctx // bounded by the client's timeout
	if err != nil {
		return Answer{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Answer{}, fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	// The agent's /healthz answer (internal/agent/healthz.Answer).
	var a struct {
		InstanceID string `json:"instance_id"`
		Served     int64  `json:"served"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return Answer{}, fmt.Errorf("answer %q: %w", body, err)
	}
	return Answer{Instance: a.InstanceID, Served: a.Served}, nil
}

// Halt stops the workers and waits for them.
func (g *Load) Halt() {
	close(g.stop)
	g.wg.Wait()
}

// Answers returns a copy of the answers so far, in arrival order.
func (g *Load) Answers() []Answer {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Answer(nil), g.got...)
}

// Count is how many requests were answered so far.
func (g *Load) Count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.got)
}

// Errors returns the failed requests' errors so far.
func (g *Load) Errors() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.errs...)
}

// Seen returns the instances that answered so far.
func (g *Load) Seen() map[string]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := map[string]bool{}
	for _, a := range g.got {
		m[a.Instance] = true
	}
	return m
}
