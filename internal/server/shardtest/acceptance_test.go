package shardtest_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func newProcessProvider(t *testing.T, stateDir, nodeDir string) *process.Provider {
	t.Helper()
	p, err := process.New(process.Config{Command: []string{"sleep", "3600"}, StateDir: stateDir, NodeDir: nodeDir, StopTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() {
		list, _ := p.List(context.Background())
		for _, inst := range list {
			_ = p.Delete(context.Background(), inst.InstanceID)
		}
	})
	return p
}

func pidAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func itoa(i int) string { return strconv.Itoa(i) }

func instanceID(providerID string) string {
	return providerID[strings.LastIndexByte(providerID, '/')+1:]
}

func TestProcessProviderScaleDrainDeleteRestart(t *testing.T) {
	stateDir, nodeDir := t.TempDir(), t.TempDir()
	store := memstore.New()
	p := newProcessProvider(t, stateDir, nodeDir)
	sh := shardtest.Start(t, shardtest.Options{Store: store, Provider: p})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)

	watch, err := c.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	require.NoError(t, err)
	_, err = watch.Header()
	require.NoError(t, err)
	events := collect(t, watch.Recv)

	upsert(t, c, "workers", 3, 2*time.Second)
	g := waitGroup(t, c, "workers", 3)
	require.Len(t, g.GetProviderIds(), 3)
	require.True(t, sort.StringsAreSorted(g.GetProviderIds()))
	for _, pid := range g.GetProviderIds() {
		require.True(t, strings.HasPrefix(pid, "nstance://test-cluster/test-1/workers-"), pid)
		n, ok := p.PID(instanceID(pid))
		require.True(t, ok)
		require.True(t, pidAlive(n), "agent process of %s runs", pid)
	}
	events.none(t, 50*time.Millisecond, func(*nstancev1.InstanceEvent) bool { return true })

	// Restart while at size 3: a new server over the same storage and
	// provider state adopts everything and creates nothing new.
	sh.Stop()
	p2 := newProcessProvider(t, stateDir, nodeDir)
	sh2 := shardtest.Start(t, shardtest.Options{Store: store, Provider: p2, CA: sh.CA})
	c = sh2.Client(t, "acme")
	time.Sleep(600 * time.Millisecond) // several resync periods
	g2 := waitGroup(t, c, "workers", 3)
	require.Equal(t, g.GetProviderIds(), g2.GetProviderIds(), "same instances after restart")
	list, err := p2.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3, "no duplicates created")
	entries, err := os.ReadDir(stateDir)
	require.NoError(t, err)
	require.Len(t, entries, 3)

	watch, err = c.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	require.NoError(t, err)
	_, err = watch.Header()
	require.NoError(t, err)
	events = collect(t, watch.Recv)

	// Scale to 1: two pending-deletion events with a deadline.
	scaled := time.Now()
	upsert(t, c, "workers", 1, 2*time.Second)
	pending := map[string]*nstancev1.InstanceEvent{}
	for len(pending) < 2 {
		ev := events.next(t, 10*time.Second, func(e *nstancev1.InstanceEvent) bool {
			return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION
		})
		require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_SCALE_DOWN, ev.GetReason())
		require.NotNil(t, ev.GetDrainDeadline())
		// The deadline is the drain timeout after the scale-down, which
		// happened between scaled and now.
		deadline := ev.GetDrainDeadline().AsTime()
		require.False(t, deadline.Before(scaled.Add(2*time.Second)), "deadline %s before scale-down + 2s", deadline)
		require.False(t, deadline.After(time.Now().Add(2*time.Second)), "deadline %s after now + 2s", deadline)
		pending[ev.GetInstanceId()] = ev
	}
	var ids []string
	for id := range pending {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	acked, waited := ids[0], ids[1]
	ackedPID, _ := p2.PID(acked)
	waitedPID, _ := p2.PID(waited)

	// The acknowledged one is deleted right away, the other only after its deadline.
	_, err = c.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: acked})
	require.NoError(t, err)
	ev := events.next(t, 5*time.Second, func(e *nstancev1.InstanceEvent) bool {
		return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED
	})
	require.Equal(t, acked, ev.GetInstanceId())
	require.True(t, ev.GetOccurredAt().AsTime().Before(pending[acked].GetDrainDeadline().AsTime()),
		"acknowledged instance deleted before its deadline, not at it")
	require.False(t, pidAlive(ackedPID))
	st, err := c.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: waited}})
	require.NoError(t, err)
	waitedAlive := pidAlive(waitedPID)
	// Both looks were before the deadline only if it has not passed yet (a
	// loaded machine may get here later); the deletion time is checked below
	// in any case.
	if time.Now().Before(pending[waited].GetDrainDeadline().AsTime()) {
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, st.GetInstance().GetState())
		require.True(t, waitedAlive, "unacknowledged instance still runs before its deadline")
	}

	ev = events.next(t, 10*time.Second, func(e *nstancev1.InstanceEvent) bool {
		return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED
	})
	require.Equal(t, waited, ev.GetInstanceId())
	require.False(t, ev.GetOccurredAt().AsTime().Before(pending[waited].GetDrainDeadline().AsTime().Add(-time.Second)), "deleted at the deadline, not before")
	require.False(t, pidAlive(waitedPID))
	waitGroup(t, c, "workers", 1)

	// DeleteGroup removes everything.
	last := waitGroup(t, c, "workers", 1).GetProviderIds()[0]
	del, err := c.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "workers"})
	require.NoError(t, err)
	require.Equal(t, uint32(1), del.GetInstancesToDelete())
	ev = events.next(t, 5*time.Second, func(e *nstancev1.InstanceEvent) bool {
		return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION
	})
	require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_GROUP_DELETED, ev.GetReason())
	require.Equal(t, last, ev.GetProviderId())
	_, err = c.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: ev.GetInstanceId()})
	require.NoError(t, err)
	events.next(t, 5*time.Second, func(e *nstancev1.InstanceEvent) bool {
		return e.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED && e.GetInstanceId() == instanceID(last)
	})
	require.Eventually(t, func() bool {
		l, _ := p2.List(ctx)
		return len(l) == 0
	}, 5*time.Second, 20*time.Millisecond)
	require.Nil(t, group(t, c, "workers"))
	objs, err := store.List(ctx, sh2.Keys.InstancePrefix(sh2.ShardID))
	require.NoError(t, err)
	require.Empty(t, objs, "no instance records left")
	nodes, err := os.ReadDir(nodeDir)
	require.NoError(t, err)
	require.Empty(t, nodes)
}

func TestTmuxProviderWindowsAndNodes(t *testing.T) {
	hosttools.Require(t, "tmux")
	socket := "nstance-shardtest-" + itoa(os.Getpid()) + "-" + itoa(int(time.Now().UnixNano()%1e9))
	session := "agents-tmux-acceptance"
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", socket, "kill-server").Run()
		_ = os.Remove(tmux.SocketPath(socket))
	})
	nodeDir := t.TempDir()
	p, err := tmux.New(tmux.Config{Command: "sleep 3600", Session: session, Socket: socket, StateDir: t.TempDir(), NodeDir: nodeDir, Shard: "s1"})
	require.NoError(t, err)
	sh := shardtest.Start(t, shardtest.Options{Provider: p})
	c := sh.Client(t, "default")
	windows := func() []string {
		out, _ := exec.Command("tmux", "-L", socket, "list-windows", "-t", session, "-F", "#{window_name}").Output()
		ws := strings.Fields(string(out))
		sort.Strings(ws)
		return ws
	}
	check := func(g *nstancev1.GroupStatus) {
		var want []string
		for _, pid := range g.GetProviderIds() {
			id := instanceID(pid)
			want = append(want, tmux.WindowName(id))
			b, err := os.ReadFile(localagent.NodePath(nodeDir, id))
			require.NoError(t, err)
			var node localagent.Node
			require.NoError(t, json.Unmarshal(b, &node))
			require.Equal(t, pid, node.Spec.ProviderID, "Node providerID equals the reported provider id")
		}
		sort.Strings(want)
		require.Eventually(t, func() bool { return strings.Join(windows(), ",") == strings.Join(want, ",") }, 5*time.Second, 20*time.Millisecond)
		// The provider removes a Node file just after killing its window.
		require.Eventually(t, func() bool {
			files, err := os.ReadDir(nodeDir)
			return err == nil && len(files) == len(want)
		}, 5*time.Second, 20*time.Millisecond, "one Node file per window")
	}
	upsert(t, c, "web", 3, time.Second)
	check(waitGroup(t, c, "web", 3))
	upsert(t, c, "web", 1, time.Second)
	g := waitGroup(t, c, "web", 1)
	require.Eventually(t, func() bool { return len(windows()) == 1 }, 10*time.Second, 50*time.Millisecond, "windows of removed instances disappear after the drain deadline")
	check(g)
	_, err = c.DeleteGroup(ctxT(t), &nstancev1.DeleteGroupRequest{GroupId: "web"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		files, _ := os.ReadDir(nodeDir)
		return len(windows()) == 0 && len(files) == 0
	}, 10*time.Second, 50*time.Millisecond)
}
