package shardtest_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy/haproxytest"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// backendMembers lists this shard's servers in the haproxy backend.
func backendMembers(t *testing.T, socket string) map[string]loadbalancer.MemberState {
	t.Helper()
	c, err := net.Dial("unix", socket)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	_, err = io.WriteString(c, "show servers state www\n")
	require.NoError(t, err)
	out, err := io.ReadAll(c)
	require.NoError(t, err)
	ms, err := haproxy.ParseServersState(string(out), "www", "nstance-test-1-")
	require.NoError(t, err)
	m := map[string]loadbalancer.MemberState{}
	for _, x := range ms {
		m[x.InstanceID] = x.State
	}
	return m
}

// TestLoadBalancedScaleDownAndReplacement is issue 33's end-to-end line with
// real parts: a real HAProxy in front of real agents' /healthz (process
// provider, NSTANCE_HEALTH_ADDR on a loopback address per instance), a shard
// server registering them through the haproxy load balancer, and a load
// generator sending requests through HAProxy while the group scales 4 -> 2
// and while a member is replaced. No request fails, and a removed instance
// answers no request sent after its deregistration; every agent's own count
// of served requests matches what the generator got from it, so nothing
// reached an agent behind the generator's back.
func TestLoadBalancedScaleDownAndReplacement(t *testing.T) {
	h := haproxytest.Start(t, haproxytest.Backend{Name: "www"})
	port := portpick.Port(t)
	bin, err := agentBinary()
	require.NoError(t, err)
	p, err := process.New(process.Config{
		Command: []string{bin}, StateDir: t.TempDir(), StopTimeout: time.Second, HealthPort: port,
		Env: []string{"NSTANCE_METRICS_INTERVAL=" + reportEvery.String(), "NSTANCE_RECONNECT_MIN=100ms", "NSTANCE_RECONNECT_MAX=1s"},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		list, _ := p.List(context.Background())
		for _, inst := range list {
			_ = p.Delete(context.Background(), inst.InstanceID)
		}
	})
	cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "process"), `"default_drain_timeout": "30s",`,
		fmt.Sprintf(`"default_drain_timeout": "30s", "health_check_interval": %q, "health_misses": %d, "agent_startup_grace": "30s",`, reportEvery, misses), 1)
	cfg = strings.Replace(cfg, `"subnet_pool": "default", "vars": { "role": "worker" } },`,
		`"subnet_pool": "default", "vars": { "role": "worker" }, "load_balancers": ["www"] },`, 1)
	cfg = strings.Replace(cfg, `"groups": {},`, fmt.Sprintf(`"groups": {}, "load_balancers": { "www": { "provider": "haproxy",
		"socket": %q, "backend": "www", "port": %d, "server_options": "check inter 500ms", "drain_delay": "1s" } },`, h.Socket, port), 1)
	sh := shardtest.Start(t, shardtest.Options{ConfigJSONC: cfg, Provider: p, Agent: app.Tuning{RepushInterval: 500 * time.Millisecond}})
	c := sh.Client(t, "acme")
	ctx := ctxT(t)

	// Every instance's deregistration time, as the server recorded it.
	var mu sync.Mutex
	deregistered := map[string]time.Time{}
	pollCtx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pollCtx.Err() == nil {
			resp, err := c.ListInstances(pollCtx, &nstancev1.ListInstancesRequest{})
			if err == nil {
				mu.Lock()
				for _, in := range resp.GetInstances() {
					for _, lb := range in.GetLoadBalancers() {
						if d := lb.GetDeregisteredAt(); d != nil && deregistered[in.GetInstanceId()].IsZero() {
							deregistered[in.GetInstanceId()] = d.AsTime()
						}
					}
				}
				mu.Unlock()
			}
			select {
			case <-pollCtx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	upsertWorkers := func(size uint32) {
		_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
			GroupId: "workers", Template: "worker", Size: size, DrainTimeout: durationpb.New(300 * time.Millisecond)}})
		require.NoError(t, err)
	}
	// waitBackend waits until the group's members are exactly the active
	// servers of the backend and every other instance is gone.
	waitBackend := func(n int) []string {
		var ids []string
		require.Eventually(t, func() bool {
			g := group(t, c, "workers")
			if g == nil || int(g.GetActualSize()) != n || int(g.GetReadyCount()) != n {
				return false
			}
			ids = ids[:0]
			want := map[string]loadbalancer.MemberState{}
			for _, pid := range g.GetProviderIds() {
				ids = append(ids, instanceID(pid))
				want[instanceID(pid)] = loadbalancer.MemberActive
			}
			resp, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
			require.NoError(t, err)
			if len(resp.GetInstances()) != n {
				return false
			}
			got := backendMembers(t, h.Socket)
			return fmt.Sprint(got) == fmt.Sprint(want)
		}, 60*time.Second, 50*time.Millisecond, "the backend never held exactly the group's %d members", n)
		sort.Strings(ids)
		return ids
	}

	upsertWorkers(4)
	first := waitBackend(4)
	load := haproxytest.StartLoad("http://"+h.Frontends["www"]+"/healthz", 4)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			load.Halt()
		}
	})
	// Traffic reaches every member before anything changes.
	require.Eventually(t, func() bool {
		return len(load.Seen()) == 4
	}, 30*time.Second, 20*time.Millisecond, "the load never reached all 4 members")

	upsertWorkers(2)
	second := waitBackend(2)
	before := load.Count()
	require.Eventually(t, func() bool { return load.Count() >= before+100 }, 30*time.Second, 20*time.Millisecond)

	// Replace a member: DeleteInstance of a group member makes the group create a successor.
	_, err = c.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: second[0]})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !deregistered[second[0]].IsZero()
	}, 30*time.Second, 20*time.Millisecond)
	third := waitBackend(2)
	require.NotContains(t, third, second[0])
	before = load.Count()
	require.Eventually(t, func() bool { return load.Count() >= before+100 }, 30*time.Second, 20*time.Millisecond)
	load.Halt()
	stopped = true
	stopPoll()
	<-polled

	got := load.Answers()
	perInstance := map[string][]haproxytest.Answer{}
	for _, a := range got {
		perInstance[a.Instance] = append(perInstance[a.Instance], a)
	}
	counts := map[string]int{}
	for id, as := range perInstance {
		counts[id] = len(as)
	}
	t.Logf("load through haproxy: %d requests answered, %d failed; per instance %v", len(got), len(load.Errors()), counts)
	fmt.Fprintf(os.Stderr, "load balancer e2e: %d requests, %d failed\n", len(got), len(load.Errors()))
	require.Zero(t, len(load.Errors()), "failed requests: %v", load.Errors())

	removed := []string{second[0]}
	for _, id := range first {
		if !strings.Contains(strings.Join(second, " "), id) {
			removed = append(removed, id)
		}
	}
	require.Len(t, removed, 3, "two scaled down, one replaced")
	mu.Lock()
	defer mu.Unlock()
	for _, id := range removed {
		at := deregistered[id]
		require.False(t, at.IsZero(), "the server recorded %s's deregistration", id)
		late := 0
		for _, a := range perInstance[id] {
			if a.Sent.After(at) {
				late++
			}
		}
		require.Zero(t, late, "%s answered %d requests sent after its deregistration at %s", id, late, at)
		require.NotEmpty(t, perInstance[id], "%s served traffic before its removal", id)
	}
	// The agents' own counts: each served exactly the requests the
	// generator got from it (its served numbers run 1..n without a gap).
	for id, as := range perInstance {
		served := make([]int64, len(as))
		for i, a := range as {
			served[i] = a.Served
		}
		sort.Slice(served, func(i, j int) bool { return served[i] < served[j] })
		for i, s := range served {
			require.Equal(t, int64(i+1), s, "%s: the agent served a request the generator did not get", id)
		}
	}
}
