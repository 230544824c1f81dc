package chaos

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/nstance-dev/nstance/internal/agent/session"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// fleetEnv names the spec file of an agent fleet: the test binary started
// with it runs the fleet's agents instead of the tests (TestMain).
const fleetEnv = "NSTANCE_CHAOS_AGENT_FLEET"

// fleetSpec is what an agent fleet process needs: one agent per instance
// id, registered at Registration with nonces minted from Key, then
// reporting to the leader address (Agent, moved by lines on stdin).
type fleetSpec struct {
	Dir          string   `json:"dir"`
	IDs          []string `json:"ids"`
	CAPEM        []byte   `json:"ca_pem"`
	Key          []byte   `json:"key"`
	Registration string   `json:"registration"`
	Agent        string   `json:"agent"`
	// Interval between an agent's reports.
	Interval time.Duration `json:"interval"`
}

// fleet is a running agent fleet process. Its agents run outside the test
// process, as agents run on other machines: thousands of TLS sessions in
// the test process starved the dev-s3 and proxies it also serves, and the
// servers' lease renewals timed out.
type fleet struct {
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	registered time.Duration
	done       chan struct{}
}

// startFleet starts the fleet and waits until every agent registered.
func startFleet(t testing.TB, spec fleetSpec, within time.Duration) *fleet {
	t.Helper()
	b, err := json.Marshal(spec)
	require.NoError(t, err)
	specFile := filepath.Join(spec.Dir, "fleet.json")
	require.NoError(t, os.MkdirAll(spec.Dir, 0o700))
	require.NoError(t, os.WriteFile(specFile, b, 0o600))
	logf, err := os.Create(filepath.Join(spec.Dir, "fleet.log"))
	require.NoError(t, err)
	f := &fleet{cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	f.cmd.Env = append(os.Environ(), fleetEnv+"="+specFile)
	f.cmd.Stderr = logf
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	f.stdin, err = f.cmd.StdinPipe()
	require.NoError(t, err)
	out, err := f.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, f.cmd.Start())
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	go func() { _ = f.cmd.Wait(); _ = logf.Close(); close(f.done) }()
	t.Cleanup(func() {
		_ = f.stdin.Close() // the fleet stops its agents and exits
		select {
		case <-f.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-f.cmd.Process.Pid, syscall.SIGKILL)
			<-f.done
		}
	})
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				<-f.done
				t.Fatalf("the agent fleet exited before registering: %s\n%s", f.cmd.ProcessState, proctest.Tail(filepath.Join(spec.Dir, "fleet.log"), 40))
			}
			if d, ok := strings.CutPrefix(l, "registered "); ok {
				f.registered, err = time.ParseDuration(d)
				require.NoError(t, err)
				return f
			}
			if msg, ok := strings.CutPrefix(l, "error: "); ok {
				t.Fatalf("agent fleet: %s", msg)
			}
		case <-timeout:
			t.Fatalf("the agent fleet did not register its %d agents within %s", len(spec.IDs), within)
		}
	}
}

// setLeader moves the fleet's leader address to addr.
func (f *fleet) setLeader(t testing.TB, addr string) {
	_, err := fmt.Fprintln(f.stdin, addr)
	require.NoError(t, err)
}

// runFleet is the fleet process: register every agent, report
// "registered <duration>" (or "error: ..."), run the sessions and follow
// the leader address given on stdin until stdin closes.
func runFleet(specFile string) int {
	fail := func(err error) int {
		fmt.Printf("error: %v\n", err)
		return 1
	}
	b, err := os.ReadFile(specFile)
	if err != nil {
		return fail(err)
	}
	var spec fleetSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fail(fmt.Errorf("fleet spec: %w", err))
	}
	if len(spec.Key) != ed25519.PrivateKeySize {
		return fail(fmt.Errorf("fleet spec: the nonce key has %d bytes", len(spec.Key)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	la := &leaderAddress{}
	la.set(spec.Agent)
	began := time.Now()
	sessions := make([]*session.Session, len(spec.IDs))
	var reg errgroup.Group
	reg.SetLimit(32)
	for i, id := range spec.IDs {
		reg.Go(func() (err error) {
			sessions[i], err = newChaosAgent(ctx, filepath.Join(spec.Dir, id), id, spec.CAPEM, ed25519.PrivateKey(spec.Key), spec.Registration, la.dial, spec.Interval)
			return err
		})
	}
	if err := reg.Wait(); err != nil {
		return fail(err)
	}
	fmt.Printf("registered %s\n", time.Since(began))
	var run sync.WaitGroup
	for _, s := range sessions {
		run.Add(1)
		go func() { defer run.Done(); _ = s.Run(ctx) }()
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if addr := strings.TrimSpace(sc.Text()); addr != "" {
			la.set(addr)
		}
	}
	cancel()
	run.Wait()
	return 0
}
