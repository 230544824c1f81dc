package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// TestMakeDevTmuxK8s runs the human path, `make dev-tmux-k8s` under Overmind
// and Air, in its own state directory, port range and agents session, then
// `make clean-dev`, and checks nothing is left running. The start-up prints
// a line at least every 30s and ends with the summary (URLs, kubeconfig,
// how to attach and stop). It rebuilds everything under Air, so it only runs
// with NSTANCE_E2E_OVERMIND=1.
func TestMakeDevTmuxK8s(t *testing.T) {
	if os.Getenv("NSTANCE_E2E_OVERMIND") != "1" {
		t.Skip("set NSTANCE_E2E_OVERMIND=1 to run make dev-tmux-k8s under Overmind")
	}
	for _, tool := range []string{"make", "tmux", "curl", "ps", "git"} {
		hosttools.Require(t, tool)
	}
	root := proctest.Root(t)
	logDir := t.TempDir()
	dir := filepath.Join(t.TempDir(), "temp") // DEV_DIR: removed by clean-dev
	base := 20990 + 100*(os.Getpid()%50)
	session := fmt.Sprintf("nstance-e2e-make-%d", os.Getpid())
	env := append(os.Environ(), "TMUX=",
		fmt.Sprintf("NSTANCE_DEV_PORT_BASE=%d", base),
		fmt.Sprintf("NSTANCE_DEV_S3_ADDR=127.0.0.1:%d", base-1),
		fmt.Sprintf("NSTANCE_DEV_K8S_ADDR=127.0.0.1:%d", base+50),
		fmt.Sprintf("NSTANCE_DEV_OPERATOR_PROBE_PORT=%d", base+51),
		"NSTANCE_DEV_AGENT_SESSION="+session,
	)
	logPath := filepath.Join(logDir, "make.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	start := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "dev-tmux-k8s", "DEV_DIR="+dir)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = root, env, pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	// Every output line with the time it arrived, also copied to make.log.
	type outLine struct {
		at   time.Time
		text string
	}
	var (
		mu    sync.Mutex
		lines []outLine
	)
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, outLine{time.Now(), sc.Text()})
			fmt.Fprintln(logf, sc.Text())
			mu.Unlock()
		}
	}()
	// summary returns the lines up to the summary's first line, or nil.
	summary := func() []outLine {
		mu.Lock()
		defer mu.Unlock()
		for i, l := range lines {
			if strings.Contains(l.text, "nstance dev stack is up") {
				return append([]outLine(nil), lines[:i+1]...)
			}
		}
		return nil
	}
	allOutput := func() string {
		mu.Lock()
		defer mu.Unlock()
		var b strings.Builder
		for _, l := range lines {
			b.WriteString(l.text + "\n")
		}
		return b.String()
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	clean := func() {
		c := exec.Command("make", "--no-print-directory", "clean-dev", "DEV_DIR="+dir)
		c.Dir, c.Env = root, env
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("make clean-dev: %v\n%s", err, out)
		}
	}
	defer func() {
		if t.Failed() {
			t.Logf("make dev-tmux-k8s output (tail):\n%s", proctest.Tail(logPath, 60))
		}
	}()

	wait := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		exited := false
		err := proctest.Wait(context.Background(), what, d, func() bool {
			select {
			case <-done:
				exited = true
				return true
			default:
				return cond()
			}
		})
		switch {
		case exited:
			clean()
			t.Fatalf("make dev-tmux-k8s exited while waiting for %s", what)
		case err != nil:
			clean()
			t.Fatal(err)
		}
	}
	for n := 0; n < 2; n++ {
		url := fmt.Sprintf("http://127.0.0.1:%d/health", base+10*n)
		wait(url, 5*time.Minute, func() bool { return proctest.HTTPOK(url) })
	}
	wait("start-up summary", 10*time.Minute, func() bool { return summary() != nil })
	upTo := summary()
	t.Logf("summary printed %s after make dev-tmux-k8s", upTo[len(upTo)-1].at.Sub(start).Round(time.Second))
	prev := start
	for _, l := range upTo {
		if gap := l.at.Sub(prev); gap > 30*time.Second {
			t.Errorf("start-up printed nothing for %s before %q", gap.Round(time.Second), l.text)
		}
		prev = l.at
	}
	time.Sleep(time.Second) // the summary's remaining lines
	out := allOutput()
	if i := strings.Index(out, "nstance dev stack is up"); i >= 0 {
		t.Logf("summary:\n%s", strings.Join(strings.SplitN(out[i:], "\n", 12)[:11], "\n"))
	}
	for _, want := range []string{
		fmt.Sprintf("http://127.0.0.1:%d", base-1),
		fmt.Sprintf("https://127.0.0.1:%d", base+50),
		fmt.Sprintf("http://127.0.0.1:%d/health (dev-1)", base),
		fmt.Sprintf("http://127.0.0.1:%d/health (dev-2)", base+10),
		fmt.Sprintf("http://127.0.0.1:%d/readyz", base+51),
		fmt.Sprintf("status      http://127.0.0.1:%d/", base-10),
		"export KUBECONFIG=" + filepath.Join(dir, "operator", "kubeconfig"),
		"tmux attach -t " + session,
		"bin/overmind connect -s " + filepath.Join(dir, "overmind.sock"),
		"Ctrl+C", "make clean-dev",
		fmt.Sprintf("lb          %s", map[bool]string{true: fmt.Sprintf("http://127.0.0.1:%d/healthz", base-2), false: "none"}[haveHAProxy()]),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("start-up summary lacks %q", want)
		}
	}
	wait("first agent registered", 5*time.Minute, func() bool {
		m, _ := filepath.Glob(filepath.Join(dir, "agents", "*", "identity", "agent.crt"))
		return len(m) > 0
	})
	t.Logf("first agent registered %s after make dev-tmux-k8s", time.Since(start).Round(time.Second))
	lbURL := fmt.Sprintf("http://127.0.0.1:%d/healthz", base-2)
	if haveHAProxy() {
		// The static workers group's agents register with the dev HAProxy
		// after their first report; /healthz then answers through it.
		wait("an agent's /healthz through the dev HAProxy "+lbURL, 3*time.Minute, func() bool { return proctest.HTTPOK(lbURL) })
		t.Logf("dev load balancer answered %s after make dev-tmux-k8s", time.Since(start).Round(time.Second))
	}
	wait("operator registered", 3*time.Minute, func() bool {
		_, err := os.Stat(filepath.Join(dir, "dev-k8s", "secrets", "default", "nstance-operator-cert.json"))
		return err == nil
	})
	t.Logf("operator registered %s after make dev-tmux-k8s", time.Since(start).Round(time.Second))
	statusURL := fmt.Sprintf("http://127.0.0.1:%d/v1/status", base-10)
	wait("status page: both shards reachable with a leader", time.Minute, func() bool {
		tok, err := os.ReadFile(filepath.Join(dir, "status", "serve.token"))
		if err != nil {
			return false
		}
		req, err := http.NewRequest(http.MethodGet, statusURL, nil)
		if err != nil {
			return false
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var snap struct {
			Shards []struct {
				Name      string `json:"name"`
				Reachable bool   `json:"reachable"`
				Leader    string `json:"leader"`
			} `json:"shards"`
		}
		if json.NewDecoder(resp.Body).Decode(&snap) != nil || len(snap.Shards) != 2 {
			return false
		}
		for _, sh := range snap.Shards {
			if !sh.Reachable || sh.Leader == "" {
				return false
			}
		}
		return true
	})
	pidFile, _ := os.ReadFile(filepath.Join(dir, "pids", "overmind.pid"))

	clean()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("make dev-tmux-k8s still running 30s after make clean-dev")
	}
	if out, err := exec.Command("tmux", "has-session", "-t", "="+session).CombinedOutput(); err == nil {
		t.Errorf("tmux session %s still exists after clean-dev: %s", session, out)
	}
	if pid := strings.TrimSpace(string(pidFile)); pid != "" {
		if out, _ := exec.Command("ps", "-o", "pid=", "--ppid", pid).Output(); strings.TrimSpace(string(out)) != "" {
			t.Errorf("children of Overmind (pid %s) still running: %s", pid, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "dev-s3")); !os.IsNotExist(err) {
		t.Errorf("clean-dev left %s behind", dir)
	}
	if proctest.Dialable(fmt.Sprintf("127.0.0.1:%d", base-2)) {
		t.Errorf("the dev HAProxy still listens after clean-dev")
	}
	for n := 0; n < 2; n++ {
		if proctest.HTTPOK(fmt.Sprintf("http://127.0.0.1:%d/health", base+10*n)) {
			t.Errorf("server %d still answers after clean-dev", n+1)
		}
	}
}

func haveHAProxy() bool { _, err := exec.LookPath("haproxy"); return err == nil }
