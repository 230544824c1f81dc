package process_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
)

func newProvider(t *testing.T, stateDir, nodeDir string) *process.Provider {
	t.Helper()
	p, err := process.New(process.Config{Command: []string{"sleep", "3600"}, StateDir: stateDir, NodeDir: nodeDir, StopTimeout: 2 * time.Second})
	require.NoError(t, err)
	return p
}

func cleanupAll(t *testing.T, p *process.Provider) {
	t.Cleanup(func() {
		list, _ := p.List(context.Background())
		for _, inst := range list {
			_ = p.Delete(context.Background(), inst.InstanceID)
		}
	})
}

func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// state follows the ")" of the command name
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			return i+2 < len(b) && b[i+2] != 'Z'
		}
	}
	return false
}

func itoa(i int) string { return strconv.Itoa(i) }

// environ returns the environment of a running process. exec.Cmd.Start
// returns once the child's execve has passed its point of no return (the
// kernel closes the close-on-exec pipe Go waits on), but the kernel fills in
// the new image's argument and environment area only afterwards: read too
// early, /proc/<pid>/environ is empty (seen on a loaded machine, and in
// about one start in ten with both cores busy). It is complete once it is
// non-empty, so wait for that.
func environ(t *testing.T, pid int) string {
	t.Helper()
	var (
		env []byte
		err error
	)
	require.Eventually(t, func() bool {
		env, err = os.ReadFile(filepath.Join("/proc", itoa(pid), "environ"))
		return err != nil || len(env) > 0
	}, 10*time.Second, 5*time.Millisecond, "environment of process %d stays empty", pid)
	require.NoError(t, err, "read the environment of process %d", pid)
	return string(env)
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	stateDir, nodeDir := t.TempDir(), t.TempDir()
	p := newProvider(t, stateDir, nodeDir)
	cleanupAll(t, p)

	req := provider.CreateRequest{InstanceID: "web-0a1b2c3d", ProviderID: provider.ID("c1", "s1", "web-0a1b2c3d"), Shard: "s1",
		AgentNonce: "nonce-jwt", CACertPEM: []byte("-----BEGIN CERTIFICATE-----\n")}
	inst, err := p.Create(ctx, req)
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, inst.State)
	require.Equal(t, req.ProviderID, inst.ProviderID)

	again, err := p.Create(ctx, req)
	require.NoError(t, err, "create is idempotent")
	pid, ok := p.PID(req.InstanceID)
	require.True(t, ok)
	require.True(t, alive(pid))
	require.Equal(t, inst.ProviderID, again.ProviderID)

	nonce, err := os.ReadFile(filepath.Join(localagent.IdentityDir(stateDir, req.InstanceID), localagent.NonceFile))
	require.NoError(t, err)
	require.Equal(t, "nonce-jwt", string(nonce))
	fi, err := os.Stat(filepath.Join(localagent.IdentityDir(stateDir, req.InstanceID), localagent.NonceFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	var node localagent.Node
	b, err := os.ReadFile(localagent.NodePath(nodeDir, req.InstanceID))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &node))
	require.Equal(t, req.ProviderID, node.Spec.ProviderID)
	require.Equal(t, req.InstanceID, node.Metadata.Name)

	require.Contains(t, environ(t, pid), localagent.EnvInstanceID+"="+req.InstanceID)

	require.NoError(t, p.Delete(ctx, req.InstanceID))
	require.Eventually(t, func() bool { return !alive(pid) }, 5*time.Second, 20*time.Millisecond)
	_, err = p.Status(ctx, req.InstanceID)
	require.ErrorIs(t, err, provider.ErrNotFound)
	_, err = os.Stat(localagent.NodePath(nodeDir, req.InstanceID))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(localagent.InstanceDir(stateDir, req.InstanceID))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, p.Delete(ctx, req.InstanceID), "deleting a missing instance is fine")
}

func TestRestartReadoptsAndDetectsDeath(t *testing.T) {
	ctx := context.Background()
	stateDir, nodeDir := t.TempDir(), t.TempDir()
	p1 := newProvider(t, stateDir, nodeDir)
	cleanupAll(t, p1)
	for _, id := range []string{"a-00000001", "a-00000002"} {
		_, err := p1.Create(ctx, provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c", "s", id)})
		require.NoError(t, err)
	}
	p2 := newProvider(t, stateDir, nodeDir)
	list, err := p2.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	for _, inst := range list {
		require.Equal(t, provider.StateRunning, inst.State, inst.Message)
		require.Equal(t, provider.ID("c", "s", inst.InstanceID), inst.ProviderID)
	}
	// Creating through the new provider adopts instead of starting another process.
	pid1, _ := p1.PID("a-00000001")
	inst, err := p2.Create(ctx, provider.CreateRequest{InstanceID: "a-00000001", ProviderID: provider.ID("c", "s", "a-00000001")})
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, inst.State)
	pid2, _ := p2.PID("a-00000001")
	require.Equal(t, pid1, pid2)

	require.NoError(t, syscall.Kill(-pid1, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		st, err := p2.Status(ctx, "a-00000001")
		return err == nil && st.State == provider.StateStopped
	}, 5*time.Second, 20*time.Millisecond)

	// The adopted live one is deleted through the new provider.
	pidB, _ := p2.PID("a-00000002")
	require.NoError(t, p2.Delete(ctx, "a-00000002"))
	require.Eventually(t, func() bool { return !alive(pidB) }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, p2.Delete(ctx, "a-00000001"))
}

func TestBadInput(t *testing.T) {
	_, err := process.New(process.Config{StateDir: t.TempDir()})
	require.Error(t, err)
	p := newProvider(t, t.TempDir(), "")
	for _, id := range []string{"", "UPPER", "../x", "a/b", "-lead", "x" + string(make([]byte, 70))} {
		_, err := p.Create(context.Background(), provider.CreateRequest{InstanceID: id})
		require.Error(t, err, id)
	}
	bad, err := process.New(process.Config{Command: []string{"/nonexistent/agent"}, StateDir: t.TempDir()})
	require.NoError(t, err)
	_, err = bad.Create(context.Background(), provider.CreateRequest{InstanceID: "x-1"})
	require.Error(t, err)
	require.False(t, errors.Is(err, provider.ErrNotFound))
	_, err = bad.Status(context.Background(), "x-1")
	require.ErrorIs(t, err, provider.ErrNotFound, "a failed start leaves nothing behind")
}

// A server killed between starting an instance's process and recording
// its PID leaves a running process with no process.json; the next Create
// of that instance (by a new leader) adopts it instead of starting a
// second one.
func TestCreateAdoptsUnrecordedProcess(t *testing.T) {
	dir := t.TempDir()
	p, err := process.New(process.Config{Command: []string{"sleep", "300"}, StateDir: dir})
	require.NoError(t, err)
	req := provider.CreateRequest{InstanceID: "i-orphan", ProviderID: "nstance://c/s/i-orphan"}
	inst, err := p.Create(context.Background(), req)
	require.NoError(t, err)
	pid, ok := p.PID(req.InstanceID)
	require.True(t, ok)
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	// cmd.Start returns once execve is past its point of no return, a
	// moment before the kernel sets up the new environment that adoption
	// matches on (/proc/PID/environ); a leader taking over later never
	// meets that window, so wait it out.
	want := localagent.EnvIdentityDir + "=" + localagent.IdentityDir(dir, req.InstanceID)
	require.Eventually(t, func() bool {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		return err == nil && slices.Contains(strings.Split(string(env), "\x00"), want)
	}, 10*time.Second, time.Millisecond, "the started process shows its environment")
	// Simulate the crash window: the PID was never recorded.
	require.NoError(t, os.Remove(filepath.Join(dir, req.InstanceID, "process.json")))

	q, err := process.New(process.Config{Command: []string{"sleep", "300"}, StateDir: dir})
	require.NoError(t, err)
	again, err := q.Create(context.Background(), req)
	require.NoError(t, err)
	qpid, ok := q.PID(req.InstanceID)
	require.True(t, ok)
	require.Equal(t, pid, qpid, "the running process was adopted, no second one started")
	require.Equal(t, inst.ProviderID, again.ProviderID)
	require.Equal(t, provider.StateRunning, again.State)
	_, err = os.Stat(filepath.Join(dir, req.InstanceID, "process.json"))
	require.NoError(t, err, "the adopted PID is recorded")
}

// A child that exits is reported stopped with how it ended (it is reaped
// when its status is read, so it does not stay a zombie).
func TestExitedChildIsReapedAndReported(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, script, want string
	}{
		{"status 3", "exit 3", "process exited: exit status 3"},
		{"status 0", "exit 0", "process exited with status 0"},
		{"killed", "kill -9 $$", "process exited: signal: killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := process.New(process.Config{Command: []string{"sh", "-c", tc.script}, StateDir: t.TempDir(), NodeDir: "", StopTimeout: time.Second})
			require.NoError(t, err)
			cleanupAll(t, p)
			inst, err := p.Create(ctx, provider.CreateRequest{InstanceID: "x1", ProviderID: "process://x1"})
			require.NoError(t, err)
			pid, ok := p.PID("x1")
			require.True(t, ok)
			require.Eventually(t, func() bool {
				inst, err = p.Status(ctx, "x1")
				require.NoError(t, err)
				return inst.State == provider.StateStopped
			}, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, tc.want, inst.Message)
			_, err = os.Stat(filepath.Join("/proc", itoa(pid)))
			require.True(t, errors.Is(err, os.ErrNotExist), "the exited child was reaped, not left a zombie")
			again, err := p.Status(ctx, "x1")
			require.NoError(t, err)
			require.Equal(t, tc.want, again.Message, "the exit stays reported")
		})
	}
}

// The provider holds no descriptor and no thread per running child.
func TestNoDescriptorOrThreadPerChild(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t, t.TempDir(), "")
	cleanupAll(t, p)
	self, err := procfs.Self()
	require.NoError(t, err)
	fds := func() int {
		n, err := self.FileDescriptorsLen()
		require.NoError(t, err)
		return n
	}
	threads := func() int {
		st, err := self.Stat()
		require.NoError(t, err)
		return st.NumThreads
	}
	const n = 60
	fd0, th0 := fds(), threads()
	for i := range n {
		_, err := p.Create(ctx, provider.CreateRequest{InstanceID: fmt.Sprintf("n%d", i), ProviderID: fmt.Sprintf("process://n%d", i)})
		require.NoError(t, err)
	}
	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, n)
	for _, inst := range list {
		require.Equal(t, provider.StateRunning, inst.State, inst.Message)
	}
	require.Less(t, fds()-fd0, 5, "descriptors grow with children")
	require.Less(t, threads()-th0, 10, "threads grow with children")
}

// Delete stops a child with SIGTERM and, when it is still there after
// StopTimeout, with SIGKILL; either way the child is gone when Delete returns.
func TestDeleteStopsWithTermThenKill(t *testing.T) {
	ctx := context.Background()
	t.Run("exits on SIGTERM: no wait for the timeout", func(t *testing.T) {
		p, err := process.New(process.Config{Command: []string{"sleep", "3600"}, StateDir: t.TempDir(), NodeDir: "", StopTimeout: time.Minute})
		require.NoError(t, err)
		cleanupAll(t, p)
		_, err = p.Create(ctx, provider.CreateRequest{InstanceID: "t1", ProviderID: "process://t1"})
		require.NoError(t, err)
		pid, ok := p.PID("t1")
		require.True(t, ok)
		start := time.Now()
		require.NoError(t, p.Delete(ctx, "t1"))
		require.Less(t, time.Since(start), time.Minute, "Delete returned as soon as the child was gone")
		_, err = os.Stat(filepath.Join("/proc", itoa(pid)))
		require.True(t, errors.Is(err, os.ErrNotExist), "the child is gone and reaped")
	})
	t.Run("ignores SIGTERM: killed after StopTimeout", func(t *testing.T) {
		const stop = 300 * time.Millisecond
		ready := filepath.Join(t.TempDir(), "trapped")
		script := `trap "" TERM; : > ` + ready + `; while :; do sleep 0.05; done`
		p, err := process.New(process.Config{Command: []string{"sh", "-c", script}, StateDir: t.TempDir(), NodeDir: "", StopTimeout: stop})
		require.NoError(t, err)
		cleanupAll(t, p)
		_, err = p.Create(ctx, provider.CreateRequest{InstanceID: "t2", ProviderID: "process://t2"})
		require.NoError(t, err)
		pid, ok := p.PID("t2")
		require.True(t, ok)
		require.Eventually(t, func() bool { _, err := os.Stat(ready); return err == nil }, 10*time.Second, 10*time.Millisecond, "the shell ignores SIGTERM")
		start := time.Now()
		require.NoError(t, p.Delete(ctx, "t2"))
		require.GreaterOrEqual(t, time.Since(start), stop, "SIGKILL only after StopTimeout")
		_, err = os.Stat(filepath.Join("/proc", itoa(pid)))
		require.True(t, errors.Is(err, os.ErrNotExist), "the child is gone and reaped")
	})
}

// Creates run outside the provider's lock: two Creates of one instance at
// once start one process (the second waits for the first and returns its
// instance), and creates of other instances meanwhile go on.
func TestConcurrentCreates(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t, t.TempDir(), "")
	cleanupAll(t, p)
	req := func(id string) provider.CreateRequest {
		return provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "s1", id), Shard: "s1"}
	}
	const n = 8
	var wg sync.WaitGroup
	insts := make([]provider.Instance, n)
	errs := make([]error, n)
	for i := range n {
		id := "web-0000000" + itoa(i%2) // two instances, four Creates each
		wg.Go(func() { insts[i], errs[i] = p.Create(ctx, req(id)) })
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, provider.StateRunning, insts[i].State)
	}
	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2, "one process per instance")
	for _, id := range []string{"web-00000000", "web-00000001"} {
		pid, ok := p.PID(id)
		require.True(t, ok)
		require.True(t, alive(pid))
		require.Contains(t, environ(t, pid), localagent.EnvInstanceID+"="+id)
	}
}

// With Nice the child and what it starts run below the server's priority;
// a value outside 0-19 is refused.
func TestNiceLowersTheChildrensPriority(t *testing.T) {
	_, err := process.New(process.Config{Command: []string{"sleep", "1"}, StateDir: t.TempDir(), Nice: 20})
	require.ErrorContains(t, err, "nice 20")
	p, err := process.New(process.Config{Command: []string{"/bin/sh", "-c", "sleep 3600 & wait"}, StateDir: t.TempDir(), StopTimeout: 2 * time.Second, Nice: 7})
	require.NoError(t, err)
	cleanupAll(t, p)
	_, err = p.Create(context.Background(), provider.CreateRequest{InstanceID: "nice-1"})
	require.NoError(t, err)
	pid, ok := p.PID("nice-1")
	require.True(t, ok)
	fs, err := procfs.NewDefaultFS()
	require.NoError(t, err)
	own, err := fs.Self()
	require.NoError(t, err)
	ownStat, err := own.Stat()
	require.NoError(t, err)
	niceOf := func(pid int) int {
		pr, err := fs.Proc(pid)
		require.NoError(t, err)
		st, err := pr.Stat()
		require.NoError(t, err)
		return st.Nice
	}
	require.Equal(t, min(ownStat.Nice+7, 19), niceOf(pid), "the shell")
	var sleeper int
	require.Eventually(t, func() bool {
		procs, err := fs.AllProcs()
		require.NoError(t, err)
		for _, pr := range procs {
			if st, err := pr.Stat(); err == nil && st.PPID == pid && st.Comm == "sleep" {
				sleeper = pr.PID
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, min(ownStat.Nice+7, 19), niceOf(sleeper), "what the shell started")
}
