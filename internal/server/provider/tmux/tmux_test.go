package tmux_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// newProvider uses a private tmux server (socket) and session per test and
// kills only that server afterwards.
func newProvider(t *testing.T, command string) (*tmux.Provider, string, string, func(args ...string) string) {
	t.Helper()
	hosttools.Require(t, "tmux")
	socket := fmt.Sprintf("nstance-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	session := "agents-" + strings.ReplaceAll(t.Name(), "/", "-")
	stateDir, nodeDir := t.TempDir(), t.TempDir()
	p, err := tmux.New(tmux.Config{Command: command, Session: session, Socket: socket, StateDir: stateDir, NodeDir: nodeDir, Shard: "dev-1"})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", socket, "kill-server").Run()
		_ = os.Remove(tmux.SocketPath(socket))
	})
	run := func(args ...string) string {
		out, _ := exec.Command("tmux", append([]string{"-L", socket}, args...)...).CombinedOutput()
		return string(out)
	}
	return p, session, nodeDir, run
}

func TestWindowsAndNodes(t *testing.T) {
	ctx := context.Background()
	p, session, nodeDir, run := newProvider(t, "sleep 3600")
	ids := []string{"workers-aaaa0001", "workers-aaaa0002"}
	for _, id := range ids {
		inst, err := p.Create(ctx, provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "dev-1", id), Shard: "dev-1", AgentNonce: "n-" + id})
		require.NoError(t, err)
		require.Equal(t, provider.StateRunning, inst.State)
	}
	windows := run("list-windows", "-t", session, "-F", "#{window_name}")
	for _, id := range ids {
		require.Contains(t, windows, "nstance-agent-"+id)
		var node localagent.Node
		b, err := os.ReadFile(localagent.NodePath(nodeDir, id))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &node))
		st, err := p.Status(ctx, id)
		require.NoError(t, err)
		require.Equal(t, provider.StateRunning, st.State)
		require.Equal(t, st.ProviderID, node.Spec.ProviderID, "Node providerID equals reported provider id")
		require.Equal(t, "nstance://c1/dev-1/"+id, node.Spec.ProviderID)
	}
	// The window's command sees the identity directory in its environment.
	env := run("show-environment", "-t", session)
	require.NotEmpty(t, env)

	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)

	require.NoError(t, p.Delete(ctx, ids[0]))
	require.NotContains(t, run("list-windows", "-t", session, "-F", "#{window_name}"), "nstance-agent-"+ids[0])
	_, err = os.Stat(localagent.NodePath(nodeDir, ids[0]))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = p.Status(ctx, ids[0])
	require.ErrorIs(t, err, provider.ErrNotFound)

	// A new provider (restarted server) sees the remaining window with its provider id.
	p2, err := tmux.New(tmux.Config{Command: "sleep 3600", Session: session, Socket: socketOf(t, p), StateDir: t.TempDir(), NodeDir: nodeDir, Shard: "dev-1"})
	require.NoError(t, err)
	st, err := p2.Status(ctx, ids[1])
	require.NoError(t, err)
	require.Equal(t, provider.ID("c1", "dev-1", ids[1]), st.ProviderID)

	require.NoError(t, p.Delete(ctx, ids[1]))
	list, err = p.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list, "no session left means no instances")
}

func socketOf(t *testing.T, p *tmux.Provider) string {
	t.Helper()
	return p.Socket()
}

func TestExitedCommandIsStopped(t *testing.T) {
	ctx := context.Background()
	p, _, _, _ := newProvider(t, "exit 3")
	_, err := p.Create(ctx, provider.CreateRequest{InstanceID: "x-1", ProviderID: "nstance://c/s/x-1"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := p.Status(ctx, "x-1")
		return err == nil && st.State == provider.StateStopped && strings.Contains(st.Message, "exited")
	}, 5*time.Second, 50*time.Millisecond)
	require.NoError(t, p.Delete(ctx, "x-1"))
}

func TestBadInput(t *testing.T) {
	_, err := tmux.New(tmux.Config{Command: "", StateDir: t.TempDir(), Shard: "dev-1"})
	require.Error(t, err)
	_, err = tmux.New(tmux.Config{Command: "x", Session: "a:b", StateDir: t.TempDir(), Shard: "dev-1"})
	require.Error(t, err)
	for _, shard := range []string{"", "a b", "a;b", "-x"} {
		_, err = tmux.New(tmux.Config{Command: "x", StateDir: t.TempDir(), Shard: shard})
		require.ErrorContains(t, err, "shard", "shard %q", shard)
	}
	p, _, _, _ := newProvider(t, "sleep 3600")
	for _, id := range []string{"", "Bad", "a;b", "../x", "a b"} {
		_, err := p.Create(context.Background(), provider.CreateRequest{InstanceID: id})
		require.Error(t, err, id)
		require.Error(t, p.Delete(context.Background(), id), id)
	}
}

// TestCLocale: a server started without a UTF-8 locale (systemd, `env -i`)
// still finds its windows; tmux prints control characters in -F output as
// '_' there, so the listing must not depend on them.
func TestCLocale(t *testing.T) {
	t.Setenv("LC_ALL", "C")
	t.Setenv("LANG", "C")
	ctx := context.Background()
	p, _, _, _ := newProvider(t, "sleep 3600")
	id := "workers-cccc0001"
	_, err := p.Create(ctx, provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "dev-1", id), Shard: "dev-1", AgentNonce: "n"})
	require.NoError(t, err)
	st, err := p.Status(ctx, id)
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State)
	list, err := p.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

// TestTwoServersShareOneSession: the dev stack's shard servers share one
// tmux server and session. When both create their first instance at the
// same moment, both see no session; the one whose new-session loses must
// add a window instead of failing (seen as a "duplicate session" provider
// error on the status page). Each round starts from no session (a second
// session keeps the tmux server itself running between rounds).
func TestTwoServersShareOneSession(t *testing.T) {
	ctx := context.Background()
	a, session, nodeDir, run := newProvider(t, "sleep 3600")
	run("new-session", "-d", "-s", "keep", "sleep 3600")
	b, err := tmux.New(tmux.Config{Command: "sleep 3600", Session: session, Socket: a.Socket(), StateDir: t.TempDir(), NodeDir: nodeDir, Shard: "dev-2"})
	require.NoError(t, err)
	for round := range 10 {
		ids := []string{fmt.Sprintf("a-%08d", round), fmt.Sprintf("b-%08d", round)}
		errs := make(chan error, 2)
		for i, p := range []*tmux.Provider{a, b} {
			go func() {
				_, err := p.Create(ctx, provider.CreateRequest{InstanceID: ids[i], ProviderID: provider.ID("c1", "dev-1", ids[i]), Shard: "dev-1", AgentNonce: "n"})
				errs <- err
			}()
		}
		require.NoError(t, <-errs, "round %d", round)
		require.NoError(t, <-errs, "round %d", round)
		windows := run("list-windows", "-t", session, "-F", "#{window_name}")
		for _, id := range ids {
			require.Contains(t, windows, "nstance-agent-"+id, "round %d", round)
		}
		run("kill-session", "-t", "="+session)
	}
}

// windowShards maps window names of the session to their shard marker
// ("" when unset).
func windowShards(t *testing.T, run func(args ...string) string, session string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(run("list-windows", "-t", "="+session, "-F", "#{window_name} #{"+tmux.ShardOption+"}")), "\n") {
		name, shard, _ := strings.Cut(line, " ")
		if name != "" {
			out[name] = shard
		}
	}
	return out
}

func ids(list []provider.Instance) []string {
	var out []string
	for _, in := range list {
		out = append(out, in.InstanceID)
	}
	return out
}

// TestShardsShareOneSession: two shards' providers in one session each list,
// report and delete only their own windows; orphan collection by either
// (delete whatever is listed without a record) keeps the other's window.
func TestShardsShareOneSession(t *testing.T) {
	ctx := context.Background()
	a, session, nodeDir, run := newProvider(t, "sleep 3600")
	b, err := tmux.New(tmux.Config{Command: "sleep 3600", Session: session, Socket: a.Socket(), StateDir: t.TempDir(), NodeDir: nodeDir, Shard: "dev-2"})
	require.NoError(t, err)
	_, err = a.Create(ctx, provider.CreateRequest{InstanceID: "w-aaaa0001", ProviderID: provider.ID("c1", "dev-1", "w-aaaa0001"), Shard: "dev-1", AgentNonce: "n"})
	require.NoError(t, err)
	_, err = b.Create(ctx, provider.CreateRequest{InstanceID: "w-bbbb0001", ProviderID: provider.ID("c1", "dev-2", "w-bbbb0001"), Shard: "dev-2", AgentNonce: "n"})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"nstance-agent-w-aaaa0001": "dev-1", "nstance-agent-w-bbbb0001": "dev-2"}, windowShards(t, run, session))

	la, err := a.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"w-aaaa0001"}, ids(la))
	lb, err := b.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"w-bbbb0001"}, ids(lb))
	_, err = a.Status(ctx, "w-bbbb0001")
	require.ErrorIs(t, err, provider.ErrNotFound, "dev-1 does not see dev-2's window")
	_, err = a.Create(ctx, provider.CreateRequest{InstanceID: "w-bbbb0001", ProviderID: "x", Shard: "dev-1", AgentNonce: "n"})
	require.ErrorContains(t, err, "belongs to shard dev-2")

	// dev-1 without any record: orphan collection deletes what it lists.
	for _, in := range la {
		require.NoError(t, a.Delete(ctx, in.InstanceID))
	}
	// Delete of the other shard's id leaves its window.
	require.NoError(t, a.Delete(ctx, "w-bbbb0001"))
	require.Equal(t, map[string]string{"nstance-agent-w-bbbb0001": "dev-2"}, windowShards(t, run, session))
	st, err := b.Status(ctx, "w-bbbb0001")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State)
}

// TestUnmarkedWindow: a window of an older version (no shard marker) is
// listed by no shard, so orphan collection never deletes it, and is logged
// once; the shard that holds its instance adopts it through Status.
func TestUnmarkedWindow(t *testing.T) {
	ctx := context.Background()
	p0, session, nodeDir, run := newProvider(t, "sleep 3600")
	run("new-session", "-d", "-s", session, "-n", "nstance-agent-old-0001", "sleep 3600")
	var logs []string
	log := funcr.New(func(prefix, args string) { logs = append(logs, args) }, funcr.Options{})
	a, err := tmux.New(tmux.Config{Command: "sleep 3600", Session: session, Socket: p0.Socket(), StateDir: t.TempDir(), NodeDir: nodeDir, Shard: "dev-1", Log: log})
	require.NoError(t, err)
	for range 3 {
		list, err := a.List(ctx)
		require.NoError(t, err)
		require.Empty(t, list)
	}
	n := 0
	for _, l := range logs {
		if strings.Contains(l, "without a shard marker") && strings.Contains(l, "nstance-agent-old-0001") {
			n++
		}
	}
	require.Equal(t, 1, n, "logged once: %q", logs)
	require.Equal(t, map[string]string{"nstance-agent-old-0001": ""}, windowShards(t, run, session))

	st, err := a.Status(ctx, "old-0001")
	require.NoError(t, err)
	require.Equal(t, provider.StateRunning, st.State)
	require.Equal(t, map[string]string{"nstance-agent-old-0001": "dev-1"}, windowShards(t, run, session), "Status adopted the window")
	list, err := a.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"old-0001"}, ids(list))
}

// TestHealthPort: with HealthPort each window's command gets
// NSTANCE_HEALTH_ADDR on the instance's own loopback address, which every
// report of the instance lists first; without it, neither.
func TestHealthPort(t *testing.T) {
	ctx := context.Background()
	hosttools.Require(t, "tmux")
	socket := fmt.Sprintf("nstance-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	stateDir := t.TempDir()
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", socket, "kill-server").Run()
		_ = os.Remove(tmux.SocketPath(socket))
	})
	for _, port := range []int{0, 18987} {
		session := fmt.Sprintf("health-%d", port)
		id := fmt.Sprintf("workers-bbbb%04d", port%10000)
		// The window's command writes what it got into a file.
		out := stateDir + "/env-" + id
		p, err := tmux.New(tmux.Config{Command: `printf '%s' "$NSTANCE_HEALTH_ADDR" > ` + out + `; sleep 3600`, Session: session,
			Socket: socket, StateDir: stateDir, Shard: "dev-1", HealthPort: port})
		require.NoError(t, err)
		inst, err := p.Create(ctx, provider.CreateRequest{InstanceID: id, ProviderID: provider.ID("c1", "dev-1", id), Shard: "dev-1", AgentNonce: "n"})
		require.NoError(t, err)
		want, wantAddrs := "", []string{"127.0.0.1"}
		if port > 0 {
			want = fmt.Sprintf("%s:%d", localagent.LoopbackAddr(id), port)
			wantAddrs = []string{localagent.LoopbackAddr(id), "127.0.0.1"}
		}
		require.Equal(t, wantAddrs, inst.Addresses, "Create")
		st, err := p.Status(ctx, id)
		require.NoError(t, err)
		require.Equal(t, wantAddrs, st.Addresses, "Status")
		list, err := p.List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, wantAddrs, list[0].Addresses, "List")
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(out)
			return err == nil && string(b) == want
		}, 10*time.Second, 20*time.Millisecond, "NSTANCE_HEALTH_ADDR in the window is not %q", want)
	}
}
