package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/syncbuf"
	"github.com/nstance-dev/nstance/internal/version"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

func testCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	return ca
}

func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nstance-agent")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

type proc struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error
}

func start(t *testing.T, bin string, env []string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin), out: &syncbuf.Buffer{}, done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), append(env, "NSTANCE_METRICS_INTERVAL=200ms", "NSTANCE_RECONNECT_MIN=50ms", "NSTANCE_RECONNECT_MAX=500ms")...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("agent did not exit; output:\n%s", p.out)
		return nil
	}
}

func TestAgentProcess(t *testing.T) {
	bin := buildAgent(t)
	shard, err := agenttest.New(logr.Discard())
	require.NoError(t, err)
	require.NoError(t, shard.Start())
	t.Cleanup(shard.Stop)
	dir := t.TempDir()
	tmpl := config.Template{
		Keys:  map[string]config.TemplateKey{"k": {Type: "ed25519", Certificate: &config.TemplateCertificate{Usages: []string{"client_auth"}}}},
		Files: map[string]config.TemplateFile{"k.crt": {Kind: "certificate", Key: "k"}, "n.env": {Kind: "env", Content: "N={{ .InstanceID }}\n"}},
	}
	envA, err := shard.Add(agenttest.Instance{ID: "proc-a", Group: "g", Template: tmpl}, dir)
	require.NoError(t, err)
	envB, err := shard.Add(agenttest.Instance{ID: "proc-b", Group: "g", Template: tmpl}, dir)
	require.NoError(t, err)
	a := start(t, bin, envA)
	b := start(t, bin, envB)

	converged := func(id string) bool {
		rec, ok := shard.Health.Get(id)
		return ok && len(rec.Last.GetFiles()) == 2 && rec.FileErrors == 0
	}
	require.Eventually(t, func() bool { return converged("proc-a") && converged("proc-b") }, 30*time.Second, 100*time.Millisecond,
		"a:\n%s\nb:\n%s", a.out, b.out)

	// SIGKILL: reports stop, and the tracker sees the instance overdue.
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, b.wait(t))
	killedAt := time.Now()
	require.Eventually(t, func() bool {
		return shard.Health.Overdue([]string{"proc-a", "proc-b"}, killedAt, time.Now(), 200*time.Millisecond)["proc-b"] >= 3
	}, 10*time.Second, 50*time.Millisecond)
	require.NotContains(t, shard.Health.Overdue([]string{"proc-a"}, killedAt, time.Now(), time.Second), "proc-a")

	// Restarted without a nonce: it reuses its stored identity.
	_, err = os.Stat(filepath.Join(dir, "proc-b", "identity", "nonce.jwt"))
	require.True(t, errors.Is(err, os.ErrNotExist))
	before, _ := shard.Health.Get("proc-b")
	b2 := start(t, bin, envB)
	require.Eventually(t, func() bool {
		rec, _ := shard.Health.Get("proc-b")
		return rec.Reports > before.Reports+2
	}, 20*time.Second, 100*time.Millisecond, "%s", b2.out)

	// SIGTERM: clean exit with a final report that announces no termination.
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, a.wait(t), "%s", a.out)
	rec, _ := shard.Health.Get("proc-a")
	require.Nil(t, rec.Last.GetTermination())
	require.NoError(t, b2.cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, b2.wait(t), "%s", b2.out)
}

func TestAgentProcessFailures(t *testing.T) {
	bin := buildAgent(t)
	// Bad configuration: exit status 2 naming the variable.
	p := start(t, bin, []string{"NSTANCE_INSTANCE_ID="})
	err := p.wait(t)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 2, ee.ExitCode())
	require.Contains(t, p.out.String(), "NSTANCE_INSTANCE_ID: required")

	// A nonce that was already used: registration is refused for good.
	shard, err := agenttest.New(logr.Discard())
	require.NoError(t, err)
	require.NoError(t, shard.Start())
	t.Cleanup(shard.Stop)
	dir := t.TempDir()
	env, err := shard.Add(agenttest.Instance{ID: "dup", Template: config.Template{}}, dir)
	require.NoError(t, err)
	nonce, err := os.ReadFile(filepath.Join(dir, "dup", "identity", "nonce.jwt"))
	require.NoError(t, err)
	first := start(t, bin, env)
	require.Eventually(t, func() bool { _, ok := shard.Health.Get("dup"); return ok }, 20*time.Second, 50*time.Millisecond)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, first.wait(t))
	// The certificate is lost but the key and nonce are still there (a crash
	// right after RegisterAgent returned): the same certificate comes back.
	idDir := filepath.Join(dir, "dup", "identity")
	firstCert, err := os.ReadFile(filepath.Join(idDir, "agent.crt"))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(idDir, "agent.crt")))
	require.NoError(t, os.WriteFile(filepath.Join(idDir, "nonce.jwt"), nonce, 0o600))
	again := start(t, bin, env)
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(idDir, "agent.crt"))
		return err == nil && string(b) == string(firstCert)
	}, 20*time.Second, 50*time.Millisecond, "the retry with the same key gets the same certificate")
	require.NoError(t, again.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, again.wait(t))
	// Wipe the whole identity (a new key) and replay the nonce: refused.
	require.NoError(t, os.Remove(filepath.Join(idDir, "agent.crt")))
	require.NoError(t, os.Remove(filepath.Join(idDir, "agent.key")))
	require.NoError(t, os.WriteFile(filepath.Join(idDir, "nonce.jwt"), nonce, 0o600))
	second := start(t, bin, env)
	err = second.wait(t)
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.ExitCode())
	require.Contains(t, second.out.String(), "registration refused")
	require.Contains(t, second.out.String(), "already been used")
}

func TestAgentArgumentsAndLogs(t *testing.T) {
	bin := buildAgent(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, version.Pattern("nstance-agent"), strings.TrimSpace(string(out)))
	out, err = exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "NSTANCE_LOG_FORMAT")
	require.Contains(t, string(out), "NSTANCE_SPOT_POLL_INTERVAL", "every variable is listed")
	out, err = exec.Command(bin, "--bogus").CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 2, ee.ExitCode())
	require.Equal(t, "nstance-agent: unknown argument \"--bogus\" (configuration comes from NSTANCE_* variables)\nRun 'nstance-agent --help' for usage.\n", string(out))

	// A bad log variable is named, like every other.
	p := start(t, bin, []string{"NSTANCE_INSTANCE_ID=x", "NSTANCE_LOG_FORMAT=xml"})
	require.ErrorAs(t, p.wait(t), &ee)
	require.Equal(t, 2, ee.ExitCode())
	require.Contains(t, p.out.String(), `NSTANCE_LOG_FORMAT: log format "xml"`)

	// JSON logs: the version first; a server that is not there is one error
	// line per attempt, with no stack trace.
	addr := portpick.Addr(t) // nothing listens there
	idDir := filepath.Join(t.TempDir(), "identity")
	require.NoError(t, os.MkdirAll(idDir, 0o700))
	// The agent reads only the nonce's shard claim; the server would check the rest.
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"shard":"s1"}`))
	require.NoError(t, os.WriteFile(filepath.Join(idDir, "nonce.jwt"), []byte("e30."+claims+".sig"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(idDir, "ca.crt"), testCA(t).CertPEM, 0o600))
	p = start(t, bin, []string{"NSTANCE_INSTANCE_ID=logs", "NSTANCE_IDENTITY_DIR=" + idDir,
		"NSTANCE_REGISTRATION_ADDR=" + addr, "NSTANCE_AGENT_ADDR=" + addr, "NSTANCE_LOG_FORMAT=json"})
	var lines []map[string]any
	require.Eventually(t, func() bool {
		lines = lines[:0]
		for _, line := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				return false
			}
			lines = append(lines, m)
		}
		return len(lines) >= 3
	}, 20*time.Second, 50*time.Millisecond, "%s", p.out.String())
	require.Equal(t, "starting", lines[0]["msg"])
	require.Equal(t, "nstance-agent", lines[0]["binary"])
	require.NotEmpty(t, lines[0]["version"], "the binary's version (go build may record a VCS one)")
	for _, l := range lines[1:] {
		require.Equal(t, "error", l["level"], "%v", l)
		require.Contains(t, l["msg"], "registration failed")
		require.NotContains(t, l, "stacktrace")
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.wait(t))
}
