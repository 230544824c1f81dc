package scripts

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// serveOn serves h on l until the test ends; TLS when tls is set.
func serveOn(t *testing.T, l net.Listener, h http.Handler, tls bool) {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.Listener.Close()
	s.Listener = l
	if tls {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
}

// serverPorts listens on two loopback ports ten apart (the dev stack's
// servers 1 and 2) and returns the listeners and the lower port.
func serverPorts(t *testing.T) (net.Listener, net.Listener, int) {
	t.Helper()
	for i := 0; i < 50; i++ {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10))
		if err == nil {
			return a, b, port
		}
		a.Close()
	}
	t.Fatal("no two free loopback ports ten apart")
	return nil, nil, 0
}

// The last step of the `make dev-tmux-k8s` start-up: scripts/dev-ready.sh
// waits for every process with a heartbeat (here the servers and the
// operator answer 503 for a while, dev-k8s only 401 as with token auth) and
// then prints the summary.
func TestDevReadySummary(t *testing.T) {
	t.Parallel()
	hosttools.Require(t, "curl")
	root := repoRoot(t)
	var ready atomic.Bool
	health := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	s3, k8s, probe, status := listen(), listen(), listen(), listen()
	one, two, base := serverPorts(t)
	serveOn(t, s3, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }), false)
	serveOn(t, one, health, false)
	serveOn(t, two, health, false)
	serveOn(t, probe, health, false)
	// The status page (nstance-admin serve) answers only with its token.
	const statusToken = "dev-ready-test-token-0123456789abcdefghij"
	serveOn(t, status, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+statusToken {
			http.Error(w, `{"error":"a credential is required"}`, http.StatusUnauthorized)
			return
		}
		health(w, r)
	}), false)
	serveOn(t, k8s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	}), true)

	dir := filepath.Join(t.TempDir(), "temp")
	if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "status"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "status", "serve.token"), []byte(statusToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	started := strconv.FormatInt(time.Now().Unix(), 10)
	if err := os.WriteFile(filepath.Join(dir, "pids", "started-at"), []byte(started+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "dev-ready.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"PS=ready",
		"NSTANCE_DEV_DIR="+dir,
		"NSTANCE_DEV_SERVERS=2",
		"NSTANCE_DEV_PORT_BASE="+strconv.Itoa(base),
		"NSTANCE_DEV_S3_ADDR="+s3.Addr().String(),
		"NSTANCE_DEV_K8S_ADDR="+k8s.Addr().String(),
		"NSTANCE_DEV_OPERATOR_PROBE_PORT="+strconv.Itoa(probe.Addr().(*net.TCPAddr).Port),
		"NSTANCE_DEV_STATUS_PORT="+strconv.Itoa(status.Addr().(*net.TCPAddr).Port),
		"NSTANCE_DEV_AGENT_SESSION=agents-test",
		fmt.Sprintf("NSTANCE_PROGRESS_INTERVAL=%g", interval.Seconds()),
	)
	s := startCmd(t, cmd)
	s.waitFor(t, fmt.Sprintf("[ready] waiting for server 1 (shard dev-1) on http://127.0.0.1:%d/health (limit 900s)", base), 20*time.Second)
	time.Sleep(2 * time.Second)
	ready.Store(true)
	r, end := s.wait(t, time.Minute)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	if n := r.count(fmt.Sprintf("[ready] still waiting for server 1 (shard dev-1) on http://127.0.0.1:%d/health (", base)); n < 2 {
		t.Errorf("%d heartbeat lines in 2s at a %s interval; output:\n%s", n, interval, r.text())
	}
	for _, want := range []string{
		"[ready] dev-s3 on http://" + s3.Addr().String() + ": ready after",
		fmt.Sprintf("[ready] server 2 (shard dev-2) on http://127.0.0.1:%d/health: ready after", base+10),
		"[ready] dev-k8s on https://" + k8s.Addr().String() + ": ready after",
		"[ready] the operator's readiness probe http://" + probe.Addr().String() + "/readyz: ready after",
		"===== nstance dev stack is up in ",
		"dev-s3      http://" + s3.Addr().String(),
		fmt.Sprintf("servers     http://127.0.0.1:%d/health (dev-1) http://127.0.0.1:%d/health (dev-2)", base, base+10),
		"dev-k8s     https://" + k8s.Addr().String(),
		"kubeconfig  export KUBECONFIG=" + filepath.Join(dir, "operator", "kubeconfig"),
		"operator    http://" + probe.Addr().String() + "/readyz",
		"status      http://" + status.Addr().String() + "/",
		"open http://" + status.Addr().String() + "/?token=" + statusToken + " once",
		"agents      tmux attach -t agents-test",
		"processes   bin/overmind connect -s " + filepath.Join(dir, "overmind.sock"),
		"stop        Ctrl+C here stops the stack; make clean-dev",
	} {
		if !r.has(want) {
			t.Errorf("no line with %q; output:\n%s", want, r.text())
		}
	}
	if strings.Contains(r.text(), "ready: error") {
		t.Errorf("errors in the output:\n%s", r.text())
	}
}
