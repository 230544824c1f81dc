package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy/haproxytest"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// lbMembers lists both shards' servers in the dev backend (dev-www), by
// instance id; nil when the runtime API does not answer.
func (s *stack) lbMembers() map[string]loadbalancer.MemberState {
	c, err := net.DialTimeout("unix", s.lbSocket, time.Second)
	if err != nil {
		return nil
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "show servers state dev-www\n"); err != nil {
		return nil
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return nil
	}
	m := map[string]loadbalancer.MemberState{}
	for _, sp := range s.servers {
		ms, err := haproxy.ParseServersState(string(out), "dev-www", "nstance-"+sp.shard+"-")
		if err != nil {
			return nil
		}
		for _, x := range ms {
			m[x.InstanceID] = x.State
		}
	}
	return m
}

// TestLoadBalancedPool is issue 33's end-to-end line in the dev stack: the
// dev HAProxy (examples/dev/haproxy.cfg) in front of the workers' agent
// /healthz (tmux provider, health_port), the servers registering each
// instance through its runtime API. A load generator sends requests
// through HAProxy's frontend while the MachinePool scales 4 -> 2 (its JSON
// file edited) and while a member is replaced (its tmux window killed): no
// request fails, no removed instance answers a request sent after HAProxy
// stopped sending it new ones (drain, maintenance or gone, as polled from
// the runtime API), and every agent's own served count matches what the
// generator got from it.
func TestLoadBalancedPool(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	begin := time.Now()
	s := newStack(t)
	s.withLB()
	s.up()
	t.Logf("stack with HAProxy up after %s", time.Since(begin).Round(100*time.Millisecond))

	const pool = "nstance-lb"
	nmp := s.example("nstancemachinepool.json")
	nmp["metadata"].(map[string]any)["name"] = pool
	s.put(resNstancePools, pool, nmp)
	mp := s.example("machinepool.json")
	mp["metadata"].(map[string]any)["name"] = pool
	mp["spec"].(map[string]any)["replicas"] = 4
	mp["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["infrastructureRef"].(map[string]any)["name"] = pool
	s.put(resPools, pool, mp)

	// active: the backend holds exactly these windows' instances, all active.
	active := func(n int) ([]string, bool) {
		ids := s.agentWindows()
		if len(ids) != n {
			return nil, false
		}
		m := s.lbMembers()
		if len(m) != n {
			return nil, false
		}
		for _, id := range ids {
			if m[id] != loadbalancer.MemberActive {
				return nil, false
			}
		}
		slices.Sort(ids)
		return ids, true
	}
	var first []string
	proctest.Eventually(t, "4 agents, each an active server of HAProxy's backend", 90*time.Second, func() bool {
		var ok bool
		first, ok = active(4)
		return ok
	})
	t.Logf("4 members in the backend after %s", time.Since(begin).Round(100*time.Millisecond))

	// HAProxy's view, polled: when each instance stopped being an active
	// server (drained, in maintenance or deleted), having been one.
	var (
		mu  sync.Mutex
		off = map[string]time.Time{}
	)
	was := map[string]bool{}
	stopPoll := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			now := time.Now()
			if m := s.lbMembers(); m != nil {
				mu.Lock()
				for id, st := range m {
					if st == loadbalancer.MemberActive {
						was[id] = true
					} else if was[id] && off[id].IsZero() {
						off[id] = now
					}
				}
				for id := range was {
					if _, ok := m[id]; !ok && off[id].IsZero() {
						off[id] = now
					}
				}
				mu.Unlock()
			}
			select {
			case <-stopPoll:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	load := haproxytest.StartLoad("http://"+s.lbAddr+"/healthz", 4)
	halted := false
	t.Cleanup(func() {
		if !halted {
			load.Halt()
			close(stopPoll)
			<-polled
		}
	})
	proctest.Eventually(t, "the load reaching all 4 members", 30*time.Second, func() bool { return len(load.Seen()) == 4 })

	// Scale 4 -> 2 by editing the MachinePool file.
	scaled := time.Now()
	mp, ok := s.get(resPools, namespace, pool)
	require.True(t, ok, "MachinePool file vanished")
	mp["spec"].(map[string]any)["replicas"] = 2
	s.put(resPools, pool, mp)
	var second []string
	proctest.Eventually(t, "2 agents left, both active in the backend, the others gone from it", 90*time.Second, func() bool {
		second, ok = active(2)
		return ok
	})
	t.Logf("scaled 4 -> 2 in %s", time.Since(scaled).Round(100*time.Millisecond))
	before := load.Count()
	proctest.Eventually(t, "100 more requests answered", 30*time.Second, func() bool { return load.Count() >= before+100 })

	// Replace a member: kill its window; the group creates a successor.
	victim := second[0]
	replaced := time.Now()
	_, err := s.tmux("kill-window", "-t", "="+s.session+":=nstance-agent-"+victim)
	require.NoError(t, err)
	s.logSuccessorWindow(t, "window killed", replaced, s.agentWindows())
	var third []string
	proctest.Eventually(t, "a successor of "+victim+" active in the backend", 90*time.Second, func() bool {
		third, ok = active(2)
		return ok && !slices.Contains(third, victim)
	})
	t.Logf("%s replaced in %s", victim, time.Since(replaced).Round(100*time.Millisecond))
	before = load.Count()
	proctest.Eventually(t, "100 more requests answered", 30*time.Second, func() bool { return load.Count() >= before+100 })
	load.Halt()
	close(stopPoll)
	<-polled
	halted = true

	got := load.Answers()
	per := map[string][]haproxytest.Answer{}
	for _, a := range got {
		per[a.Instance] = append(per[a.Instance], a)
	}
	counts := map[string]int{}
	for id, as := range per {
		counts[id] = len(as)
	}
	t.Logf("load through the dev HAProxy: %d requests answered, %d failed; per instance %v", len(got), len(load.Errors()), counts)
	fmt.Fprintf(os.Stderr, "dev-stack load balancer e2e: %d requests, %d failed\n", len(got), len(load.Errors()))
	require.Zero(t, len(load.Errors()), "failed requests: %v", load.Errors())

	removed := []string{victim}
	for _, id := range first {
		if !slices.Contains(second, id) {
			removed = append(removed, id)
		}
	}
	require.Len(t, removed, 3, "two scaled down, one replaced")
	mu.Lock()
	defer mu.Unlock()
	for _, id := range removed {
		at := off[id]
		require.False(t, at.IsZero(), "HAProxy was never seen taking %s out", id)
		late := 0
		for _, a := range per[id] {
			if a.Sent.After(at) {
				late++
			}
		}
		require.Zero(t, late, "%s answered %d requests sent after HAProxy took it out at %s", id, late, at.Format(time.RFC3339Nano))
		require.NotEmpty(t, per[id], "%s served traffic before its removal", id)
	}
	for _, id := range third {
		require.NotEmpty(t, per[id], "member %s got no traffic", id)
	}
	// The agents' own counts: each served exactly the requests the
	// generator got from it (1..n without a gap), so nothing reached an
	// agent behind the generator's back.
	for id, as := range per {
		served := make([]int64, len(as))
		for i, a := range as {
			served[i] = a.Served
		}
		sort.Slice(served, func(i, j int) bool { return served[i] < served[j] })
		for i, n := range served {
			require.Equal(t, int64(i+1), n, "%s: the agent served a request the generator did not get", id)
		}
	}

	// An agent stopped with SIGTERM (what a shutdown sends): its window's
	// pane stays, dead, as the VM's remains; the server hears the stream
	// close, asks the tmux provider at once and replaces it.
	windows := s.agentWindows()
	out, err := s.tmux("list-panes", "-t", "="+s.session+":=nstance-agent-"+third[0], "-F", "#{pane_pid}")
	require.NoError(t, err, out)
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	require.NoError(t, err, out)
	stopped := time.Now()
	require.NoError(t, syscall.Kill(pid, syscall.SIGTERM))
	s.logSuccessorWindow(t, "agent stopped with SIGTERM", stopped, windows)
}

// logSuccessorWindow waits for an agent window that is not among before
// and logs how long after start it appeared (the dev stack's replacement
// time; the health rule alone would take 90 s).
func (s *stack) logSuccessorWindow(t *testing.T, what string, start time.Time, before []string) {
	t.Helper()
	// Polled every 10 ms (tmux answers in a few): proctest's 100 ms would
	// blur the figure.
	fresh := func() bool {
		for _, id := range s.agentWindows() {
			if !slices.Contains(before, id) {
				return true
			}
		}
		return false
	}
	for deadline := start.Add(60 * time.Second); !fresh(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no successor window within 60s", what)
		}
	}
	took := time.Since(start)
	t.Logf("%s: successor window after %s", what, took.Round(time.Millisecond))
	fmt.Fprintf(os.Stderr, "dev-stack replacement (%s): successor window after %s\n", what, took.Round(time.Millisecond))
}
