package proctest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStartAndStop(t *testing.T) {
	root, err := RepoRoot()
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)

	log := filepath.Join(t.TempDir(), "logs", "sh.log")
	// A child that ignores SIGTERM is killed after the grace period, with
	// its own child (same process group).
	p, err := Start("sh", log, t.TempDir(), os.Environ(), "/bin/sh", "-c", `trap "" TERM; echo up; sleep 60 & wait`)
	require.NoError(t, err)
	require.NoError(t, p.WaitFor(context.Background(), "up", 10*time.Second, func() bool { return LogContains(log, "up") }))
	require.False(t, p.Exited())
	p.Stop(200 * time.Millisecond)
	require.True(t, p.Exited())
	p.Stop(time.Second) // idempotent
}

func TestRestartAppendsToTheLog(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sh.log")
	p, err := Start("sh", log, t.TempDir(), nil, "/bin/sh", "-c", `echo run; sleep 60`)
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	_, err = p.Restart()
	require.ErrorContains(t, err, "still runs")
	require.NoError(t, p.WaitFor(context.Background(), "first run", 10*time.Second, func() bool { return LogContains(log, "run") }))
	p.Kill()
	n, err := p.Restart()
	require.NoError(t, err)
	t.Cleanup(n.Kill)
	require.NoError(t, n.WaitFor(context.Background(), "second run", 10*time.Second, func() bool {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "run") == 2
	}))
	require.NotEqual(t, p.Pid(), n.Pid())
}

func TestWaitForAProcessThatExits(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sh.log")
	p, err := Start("sh", log, t.TempDir(), nil, "/bin/sh", "-c", `echo giving up; exit 3`)
	require.NoError(t, err)
	err = p.WaitFor(context.Background(), "never", time.Minute, func() bool { return false })
	require.ErrorContains(t, err, "sh exited (exit status 3) while waiting for never")
	require.ErrorContains(t, err, "giving up")
}

// recTB records what a Group does with its test.
type recTB struct {
	testing.TB
	failed   bool
	logs     []string
	cleanups []func()
}

func (r *recTB) Failed() bool     { return r.failed }
func (r *recTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recTB) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func TestGroupStopsInReverseOrderAndPrintsLogsOnFailure(t *testing.T) {
	dir := t.TempDir()
	order := filepath.Join(dir, "order")
	rec := &recTB{TB: t, failed: true}
	g := NewGroup(rec, Options{Dir: dir, Grace: 10 * time.Second, TailLines: 1, Env: []string{"ORDER=" + order}})
	require.Len(t, rec.cleanups, 1, "NewGroup registers Close")
	var procs []*Proc
	for _, name := range []string{"a", "b"} {
		// Each records its SIGTERM; the trap runs once sleep is killed
		// with the group.
		p := g.MustStart(name, "/bin/sh", []string{"NAME=" + name}, "-c",
			`exec 2>/dev/null; trap 'echo "$NAME" >>"$ORDER"; exit 0' TERM; echo first; echo "$NAME ready"; while :; do sleep 1; done`)
		require.NoError(t, p.WaitFor(context.Background(), name+" ready", 10*time.Second, func() bool {
			return LogContains(filepath.Join(dir, "logs", name+".log"), name+" ready")
		}))
		procs = append(procs, p)
	}
	// A restarted process stays in the group; its log is printed once.
	procs[0].Kill()
	a2, err := g.Restart(procs[0])
	require.NoError(t, err)
	require.NoError(t, a2.WaitFor(context.Background(), "a again", 10*time.Second, func() bool {
		b, _ := os.ReadFile(a2.Log)
		return strings.Count(string(b), "a ready") == 2
	}))
	rec.cleanups[0]()
	g.Close() // idempotent
	for _, p := range append(procs, a2) {
		require.True(t, p.Exited())
	}
	b, err := os.ReadFile(order)
	require.NoError(t, err)
	require.Equal(t, "a\nb\n", string(b), "the restarted a started last and stops first; a's first run was killed (no SIGTERM)")
	require.Len(t, rec.logs, 2, "one tail per log")
	require.Contains(t, rec.logs[0], "---- a (")
	require.True(t, strings.HasSuffix(rec.logs[0], "\na ready"), rec.logs[0])
	require.True(t, strings.HasSuffix(rec.logs[1], "\nb ready"), rec.logs[1])

	// Added after Close: stopped at once.
	late, err := Start("late", filepath.Join(dir, "late.log"), dir, nil, "/bin/sh", "-c", "sleep 60")
	require.NoError(t, err)
	g.Add(late)
	require.True(t, late.Exited())
}

func TestWait(t *testing.T) {
	n := 0
	require.NoError(t, Wait(context.Background(), "three calls", 10*time.Second, func() bool { n++; return n == 3 }))
	err := Wait(context.Background(), "nothing", 300*time.Millisecond, func() bool { return false })
	require.EqualError(t, err, "timed out after 300ms waiting for nothing")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Wait(ctx, "nothing", time.Minute, func() bool { return false })
	require.EqualError(t, err, "waiting for nothing: context canceled")
}

func TestStopRecorded(t *testing.T) {
	dir := t.TempDir()
	p, err := Start("agent", filepath.Join(dir, "agent.log"), dir, nil, "/bin/sh", "-c", "sleep 60 & wait")
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	other, err := Start("other", filepath.Join(dir, "other.log"), dir, nil, "/bin/sh", "-c", "sleep 60 & wait")
	require.NoError(t, err)
	t.Cleanup(other.Kill)
	ticks, ok := StartTicks(p.Pid())
	require.True(t, ok)
	write := func(id string, rec record) {
		b, err := json.Marshal(rec)
		require.NoError(t, err)
		require.NoError(t, WriteFile(filepath.Join(dir, "agents", id, "process.json"), b, 0o600))
	}
	write("i-1", record{PID: p.Pid(), StartTicks: ticks})
	// A record whose PID now names another process (its recorded start
	// differs from that process's real one): left alone. (ticks+1 was not
	// enough: on a loaded machine other can start one tick after p.)
	otherTicks, ok := StartTicks(other.Pid())
	require.True(t, ok)
	write("i-2", record{PID: other.Pid(), StartTicks: otherTicks + 1000})
	StopRecorded(filepath.Join(dir, "agents", "*", "process.json"), 5*time.Second)
	select {
	case <-p.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the recorded process still runs")
	}
	require.False(t, other.Exited())
}

func TestBinariesKeepAFailedBuild(t *testing.T) {
	var b Binaries
	t.Cleanup(func() { require.NoError(t, b.Remove()) })
	_, err := b.Build("no-such-command")
	require.ErrorContains(t, err, "go build [no-such-command]")
	_, err2 := b.Build("dev-s3")
	require.Equal(t, err, err2, "a failed build is not tried again")
}

func TestConfigFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a", "b.json")
	require.NoError(t, WriteJSON(p, map[string]int{"x": 1}))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "{\n  \"x\": 1\n}\n", string(b))
	require.Equal(t, "cluster_id: c\ntenant: t\nshards:\n  dev-1:\n    registration_addr: \"r:1\"\n    operator_addr: \"o:1\"\n",
		string(OperatorConfig("c", "t", OperatorShard{Name: "dev-1", Registration: "r:1", Operator: "o:1"})))
}
