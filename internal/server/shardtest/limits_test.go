package shardtest_test

import (
	"context"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func goroutines() int {
	s := []metrics.Sample{{Name: "/sched/goroutines:goroutines"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestTenThousandWatchesFromOneOperator: one operator opens 10,000
// WatchGroups streams over one real mTLS connection. The first
// max_watches_per_operator (default) are served and keep receiving events;
// every other one is refused with ResourceExhausted; the server's goroutines
// stay bounded; another operator is unaffected.
func TestTenThousandWatchesFromOneOperator(t *testing.T) {
	const n = 10000
	limit := config.DefaultMaxWatchesPerOperator
	sh := shardtest.Start(t, shardtest.Options{})
	c := sh.Client(t, "acme")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runtime.GC()
	g0 := goroutines()

	type held struct {
		cancel context.CancelFunc
		recv   func() (*nstancev1.GroupEvent, error)
	}
	var served []held
	refused := 0
	for i := 0; i < n; i++ {
		wctx, wcancel := context.WithCancel(ctx)
		ws, err := c.WatchGroups(wctx, &nstancev1.WatchGroupsRequest{})
		require.NoError(t, err)
		md, err := ws.Header()
		require.NoError(t, err)
		if len(md.Get("nstance-shard")) > 0 {
			served = append(served, held{cancel: wcancel, recv: ws.Recv})
			continue
		}
		_, err = ws.Recv()
		wcancel()
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "watch %d: %v", i, err)
		refused++
	}
	defer func() {
		for _, h := range served {
			h.cancel()
		}
	}()
	require.Len(t, served, limit)
	require.Equal(t, n-limit, refused)
	g1 := goroutines()
	t.Logf("watches served %d refused %d; goroutines %d -> %d", len(served), refused, g0, g1)
	require.Less(t, g1-g0, 10*limit, "server goroutines grew with refused watches")

	// The served watches still carry events.
	upsert(t, c, "web", 0, 0)
	for _, h := range []held{served[0], served[limit-1]} {
		ev, err := h.recv()
		require.NoError(t, err)
		require.Equal(t, "web", ev.GetGroupId())
	}
	// Another operator has its own allowance.
	other := sh.Client(t, "globex")
	ws, err := other.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
	require.NoError(t, err)
	md, err := ws.Header()
	require.NoError(t, err)
	require.NotEmpty(t, md.Get("nstance-shard"))
}

// TestTenantQuotasOverGRPC: quotas answer ResourceExhausted (groups, create
// rate) or InvalidArgument (vars, labels) with a message naming the limit,
// and nothing is stored for a refused request.
func TestTenantQuotasOverGRPC(t *testing.T) {
	cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "limits": {"max_groups_per_tenant": 2, "max_vars": 2, "max_labels": 1, "tenant_create_rate": {"per_minute": 1, "burst": 2}},`, 1)
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: cfg})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)
	upsert(t, c, "a", 0, 0)
	upsert(t, c, "b", 0, 0)
	_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "c", Template: "worker"}})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "shard.limits.max_groups_per_tenant")
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "a", Template: "worker",
		Vars: map[string]string{"x": "1", "y": "2", "z": "3"}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "vars: 3 entries, more than shard.limits.max_vars (2)")
	_, err = c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker", Labels: map[string]string{"x": "1", "y": "2"}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "shard.limits.max_labels")

	for i := 0; i < 2; i++ {
		_, err = c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker"})
		require.NoError(t, err)
	}
	_, err = c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker"})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "shard.limits.tenant_create_rate")
	list, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetInstances(), 2)
	groups, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	require.Len(t, groups.GetGroups(), 2)
}

// TestValueLengthsAndTenantGroupBytesOverGRPC: the new limits reach a
// client as InvalidArgument (a value too long) and ResourceExhausted (a
// tenant's groups too large), each naming its shard.limits key.
func TestValueLengthsAndTenantGroupBytesOverGRPC(t *testing.T) {
	cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "limits": {"max_var_value_bytes": 2000, "max_tenant_group_bytes": 4096},`, 1)
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: cfg})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)
	_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "a", Template: "worker",
		Vars: map[string]string{"big": strings.Repeat("x", 2001)}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), `var "big": value of 2001 bytes, more than shard.limits.max_var_value_bytes (2000)`)
	_, err = c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker", Vars: map[string]string{"big": strings.Repeat("x", 2001)}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)

	vars := map[string]string{"v1": strings.Repeat("x", 1500)}
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "a", Template: "worker", Vars: vars}})
	require.NoError(t, err)
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "b", Template: "worker", Vars: vars}})
	require.NoError(t, err)
	_, err = c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "c", Template: "worker", Vars: vars}})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "shard.limits.max_tenant_group_bytes (4096)")
	groups, err := c.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	require.Len(t, groups.GetGroups(), 2)
}

func liveHeap() int64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestSlowWatcherIsDisconnectedNotBuffered: a watcher that stops reading
// holds at most shard.limits.watch_buffer events plus what HTTP/2 flow
// control lets through; then the server drops it (ResourceExhausted once it
// reads again) instead of buffering the rest. 100,000 events of 1 KiB are
// published meanwhile; the live heap stays far below their 100 MiB.
func TestSlowWatcherIsDisconnectedNotBuffered(t *testing.T) {
	cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "limits": {"watch_buffer": 16},`, 1)
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: cfg})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)
	ws, err := c.WatchGroups(ctx, &nstancev1.WatchGroupsRequest{})
	require.NoError(t, err)
	_, err = ws.Header()
	require.NoError(t, err)
	hub := sh.Assembly.Events.Groups
	require.Equal(t, 1, hub.Subscribers("acme"))
	h0 := liveHeap()
	const n = 100000
	published := 0
	for ; published < n && hub.Subscribers("acme") > 0; published++ {
		hub.Publish("acme", &nstancev1.GroupEvent{Type: nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT, GroupId: strings.Repeat("g", 1024)})
		if published%8 == 7 {
			// Paced, so the server sends until HTTP/2 flow control stops it.
			time.Sleep(time.Millisecond)
		}
	}
	h1 := liveHeap()
	t.Logf("watcher dropped after %d events; live heap %d KiB -> %d KiB", published, h0>>10, h1>>10)
	require.Zero(t, hub.Subscribers("acme"), "the slow watcher was dropped")
	require.Less(t, published, n/2)
	require.Less(t, h1-h0, int64(48<<20))

	got := 0
	for {
		_, err := ws.Recv()
		if err != nil {
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), "fell too far behind")
			break
		}
		got++
	}
	require.Less(t, got, published)
}

// TestOversizedFilesReportedToTheTenant: with real agent processes, a group
// var that makes an instance's files larger than shard.limits.max_file_bytes
// is not delivered: the tenant's WatchErrors gets one config error naming the
// instance and the limit, the agent keeps its file and keeps reporting on its
// connection, and a var within the limit is delivered again.
func TestOversizedFilesReportedToTheTenant(t *testing.T) {
	cfg := strings.Replace(agentConfig("worker"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "limits": {"max_file_bytes": 4096, "max_var_value_bytes": 8192},`, 1)
	a := startAgentShardWith(t, cfg)
	a.upsert(t, 1, "")
	waitGroup(t, a.c, "workers", 1)
	id := a.ids(t)[0]
	require.Eventually(t, func() bool { return a.file(id, "role.txt") == "role=worker group=workers" }, 10*time.Second, 20*time.Millisecond)
	_, errs := a.watch(t)

	setRole := func(role string) {
		_, err := a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
			GroupId: "workers", Template: "worker", Size: 1, Vars: map[string]string{"role": role}}})
		require.NoError(t, err)
	}
	setRole(strings.Repeat("x", 5000))
	ev := errs.next(t, 10*time.Second, func(e *nstancev1.ErrorEvent) bool { return e.GetInstanceId() == id })
	require.Equal(t, nstancev1.ErrorSource_ERROR_SOURCE_CONFIG, ev.GetSource())
	require.Equal(t, "workers", ev.GetGroupId())
	require.Contains(t, ev.GetMessage(), "more than shard.limits.max_file_bytes (4096)")
	// The agent keeps reporting (same instance, still running) and keeps its file.
	rec, ok := a.sh.Assembly.Term().Agents.Get(id)
	require.True(t, ok)
	seen := rec.Reports
	require.Eventually(t, func() bool { r, _ := a.sh.Assembly.Term().Agents.Get(id); return r.Reports >= seen+3 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "role=worker group=workers", a.file(id, "role.txt"))
	errs.none(t, 200*time.Millisecond, func(e *nstancev1.ErrorEvent) bool { return e.GetInstanceId() == id })

	setRole("small")
	require.Eventually(t, func() bool { return a.file(id, "role.txt") == "role=small group=workers" }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{id}, a.ids(t))
}
