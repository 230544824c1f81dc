package shardtest_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
)

// vmShell is the "VM" of TestVMsThatGoAreReplacedAtOnce: a shell that runs
// the agent again whenever it exits (as systemd or Air would), unless a halt
// file beside the identity directory exists by then (the VM shuts down with
// its agent); the shell is what the process provider watches, so an agent
// restart leaves the VM running.
const vmShell = `while :; do "$0"; [ -e "$NSTANCE_IDENTITY_DIR.halt" ] && exit 0; sleep 0.1; done`

// childOf returns the pid of a process whose parent is ppid (0: none).
func childOf(t testing.TB, ppid int) int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			return pid
		}
	}
	return 0
}

// TestVMsThatGoAreReplacedAtOnce runs real agents under a VM shell with a
// health rule that would take 90 s (30 s reports, 3 misses), so only the
// signs a VM gives when it goes can explain a replacement within the test:
//   - an agent restarted on a living VM (it says its host is going down,
//     NSTANCE_SHUTDOWN_DETECT=always, then comes back): nothing replaced;
//   - a VM killed outright: its stream breaks, the provider is asked at
//     once and the replacement is created;
//   - an agent that reports its host's shutdown, then the VM stops: the
//     provider's answer is awaited and the replacement created.
//
// The times are logged (the benchmark in bench/replacement measures them).
func TestVMsThatGoAreReplacedAtOnce(t *testing.T) {
	cfg := strings.Replace(agentConfig("worker"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "health_check_interval": "30s", "health_misses": 3, "agent_startup_grace": "60s", "shutdown_grace": "60s",`, 1)
	a := startAgentShardProc(t, cfg, func(c *process.Config) {
		c.Command = append([]string{"/bin/sh", "-c", vmShell}, c.Command...)
		c.Env = append(c.Env, "NSTANCE_SHUTDOWN_DETECT=always")
	})
	a.upsert(t, 2, "")
	waitGroup(t, a.c, "workers", 2)
	members := a.ids(t)
	slices.Sort(members)
	shell := func(id string) int {
		pid, ok := a.p.PID(id)
		require.True(t, ok)
		return pid
	}
	agentOf := func(id string) int {
		var pid int
		require.Eventually(t, func() bool { pid = childOf(t, shell(id)); return pid != 0 }, 10*time.Second, 10*time.Millisecond, "agent of %s running", id)
		return pid
	}
	records := func() []string {
		var out []string
		for _, r := range a.sh.Assembly.Instances.ListGroup("acme", "workers") {
			out = append(out, r.ID)
		}
		slices.Sort(out)
		return out
	}
	// newMember waits for a member that is not in known and returns it with
	// the time it took from start.
	newMember := func(known []string, start time.Time, what string) (string, time.Duration) {
		var fresh string
		require.Eventually(t, func() bool {
			for _, id := range records() {
				if !slices.Contains(known, id) {
					fresh = id
					return true
				}
			}
			return false
		}, 30*time.Second, 2*time.Millisecond, "%s: a replacement is created well within the health rule's 90 s", what)
		return fresh, time.Since(start)
	}

	// 1. An agent restart on a living VM.
	restarted := members[0]
	old := agentOf(restarted)
	restartAt := time.Now()
	require.NoError(t, syscall.Kill(old, syscall.SIGTERM))
	require.Eventually(t, func() bool {
		now := childOf(t, shell(restarted))
		if now == 0 || now == old {
			return false
		}
		term := a.sh.Assembly.Term()
		p, ok := term.Agents.Presence(restarted)
		rec, _ := term.Agents.Get(restarted)
		return ok && p.Streams > 0 && p.ShutdownAt.IsZero() && rec.Received.After(restartAt)
	}, 20*time.Second, 10*time.Millisecond, "the restarted agent is back and its host-shutdown report superseded")
	require.Equal(t, members, records(), "an agent restart replaces nothing")
	rec, ok := a.sh.Assembly.Instances.Get(restarted)
	require.True(t, ok)
	require.Equal(t, instances.StateRunning, rec.State)

	// 2. A VM killed outright.
	killed := members[1]
	killAt := time.Now()
	require.NoError(t, syscall.Kill(-shell(killed), syscall.SIGKILL))
	fresh, took := newMember(members, killAt, "killed VM")
	t.Logf("VM killed: replacement %s created %s after the kill", fresh, took.Round(time.Millisecond))
	waitGroup(t, a.c, "workers", 2)
	require.Eventually(t, func() bool { return !slices.Contains(records(), killed) }, 20*time.Second, 20*time.Millisecond, "the killed member is deleted")

	// 3. A host shutdown reported by its agent, then the VM stops.
	known := records()
	down := restarted
	require.NoError(t, os.WriteFile(localagent.IdentityDir(a.stateDir, down)+".halt", nil, 0o600))
	stopAt := time.Now()
	require.NoError(t, syscall.Kill(agentOf(down), syscall.SIGTERM))
	fresh, took = newMember(known, stopAt, "host shutdown")
	t.Logf("host shutdown: replacement %s created %s after the agent was stopped", fresh, took.Round(time.Millisecond))
	waitGroup(t, a.c, "workers", 2)
	require.Eventually(t, func() bool { return !slices.Contains(records(), down) }, 20*time.Second, 20*time.Millisecond, "the stopped member is deleted")
}
