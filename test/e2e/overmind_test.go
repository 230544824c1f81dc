package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// TestMakeDevTmuxK8s runs the human path, `make dev-tmux-k8s` under Overmind
// and Air, in its own state directory, port range and agents session, then
// `make clean-dev`, and checks nothing is left running. It rebuilds
// everything under Air, so it only runs with NSTANCE_E2E_OVERMIND=1.
func TestMakeDevTmuxK8s(t *testing.T) {
	if os.Getenv("NSTANCE_E2E_OVERMIND") != "1" {
		t.Skip("set NSTANCE_E2E_OVERMIND=1 to run make dev-tmux-k8s under Overmind")
	}
	for _, tool := range []string{"make", "tmux", "curl", "ps", "git"} {
		hosttools.Require(t, tool)
	}
	root := repoRoot(t)
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
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = root, env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
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
			t.Logf("make dev-tmux-k8s output (tail):\n%s", tail(logPath, 60))
		}
	}()

	wait := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			select {
			case <-done:
				clean()
				t.Fatalf("make dev-tmux-k8s exited while waiting for %s", what)
			default:
			}
			if time.Now().After(deadline) {
				clean()
				t.Fatalf("timed out after %s waiting for %s", d, what)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for n := 0; n < 2; n++ {
		url := fmt.Sprintf("http://127.0.0.1:%d/health", base+10*n)
		wait(url, 5*time.Minute, func() bool { return httpOK(url) })
	}
	wait("first agent registered", 5*time.Minute, func() bool {
		m, _ := filepath.Glob(filepath.Join(dir, "agents", "*", "identity", "agent.crt"))
		return len(m) > 0
	})
	t.Logf("first agent registered %s after make dev-tmux-k8s", time.Since(start).Round(time.Second))
	wait("operator registered", 3*time.Minute, func() bool {
		_, err := os.Stat(filepath.Join(dir, "dev-k8s", "secrets", "default", "nstance-operator-cert.json"))
		return err == nil
	})
	t.Logf("operator registered %s after make dev-tmux-k8s", time.Since(start).Round(time.Second))
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
	for n := 0; n < 2; n++ {
		if httpOK(fmt.Sprintf("http://127.0.0.1:%d/health", base+10*n)) {
			t.Errorf("server %d still answers after clean-dev", n+1)
		}
	}
}
