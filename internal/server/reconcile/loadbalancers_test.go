package reconcile_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy/haproxytest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// flaky is a real load balancer provider whose next calls of one kind fail.
type flaky struct {
	loadbalancer.Provider
	mu    sync.Mutex
	fails map[string]int
	calls []string
}

func (f *flaky) fail(op string, n int) { f.mu.Lock(); f.fails[op] = n; f.mu.Unlock() }

func (f *flaky) note(op, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op+" "+id)
	if f.fails[op] > 0 {
		f.fails[op]--
		return errors.New("injected " + op + " failure")
	}
	return nil
}

func (f *flaky) Register(ctx context.Context, t loadbalancer.Target) error {
	if err := f.note("register", t.InstanceID); err != nil {
		return err
	}
	return f.Provider.Register(ctx, t)
}

func (f *flaky) Deregister(ctx context.Context, t loadbalancer.Target) error {
	if err := f.note("deregister", t.InstanceID); err != nil {
		return err
	}
	return f.Provider.Deregister(ctx, t)
}

func (f *flaky) Remove(ctx context.Context, t loadbalancer.Target) error {
	if err := f.note("remove", t.InstanceID); err != nil {
		return err
	}
	return f.Provider.Remove(ctx, t)
}

func haproxyCommand(t *testing.T, socket, cmd string) string {
	t.Helper()
	c, err := net.Dial("unix", socket)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	_, err = io.WriteString(c, cmd+"\n")
	require.NoError(t, err)
	b, err := io.ReadAll(c)
	require.NoError(t, err)
	return string(b)
}

// TestLoadBalancerLifecycle runs the reconciler against a real HAProxy:
// members are registered after their first health report (not before),
// a scale-down deregisters the removed member, waits the entry's delay and
// removes it before its drain is announced, failed calls are retried with
// backoff, and a new term converges the backend to the group's members
// (a member removed behind its back registered again, a stranger with our
// prefix removed, the foreign server untouched).
func TestLoadBalancerLifecycle(t *testing.T) {
	ctx := context.Background()
	h := haproxytest.Start(t, haproxytest.Backend{Name: "www", Servers: []string{"static1 127.0.0.1:1 disabled"}})
	cfg := newShardConfig(t).health(10*time.Second, 3, time.Minute).build(t)
	cfg.LoadBalancers = map[string]config.LoadBalancer{"www": {"provider": "haproxy", "socket": h.Socket, "backend": "www",
		"port": float64(8080), "server_options": "", "drain_delay": "20s"}}
	tmpl := cfg.Templates["worker"]
	tmpl.LoadBalancers = []string{"www"}
	cfg.Templates["worker"] = tmpl
	reg := loadbalancer.NewRegistry(haproxy.Kind())
	require.Empty(t, reg.Check(cfg))
	real, err := reg.New(ctx, loadbalancer.Env{Name: "www", Config: func() *config.Config { return cfg }, Log: logr.Discard()})
	require.NoError(t, err)
	lb := &flaky{Provider: real, fails: map[string]int{}}
	s := newShard(t, cfg, shardOptions{monitor: true, lbs: map[string]loadbalancer.Provider{"www": lb}})
	sub := s.events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	members := func() map[string]loadbalancer.MemberState { return memberStates(t, real) }

	s.upsert(t, "web", 3, time.Minute)
	ids := s.ids("web")
	require.Len(t, ids, 3)
	require.Empty(t, members(), "nothing is registered before the first health report")
	lbStatus := func(id string) *nstancev1.LoadBalancerTarget {
		rec, ok := s.insts.Get(id)
		require.True(t, ok)
		st := s.ops.Status(rec)
		require.Len(t, st.GetLoadBalancers(), 1)
		return st.GetLoadBalancers()[0]
	}
	require.Equal(t, nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_PENDING, lbStatus(ids[0]).GetState())

	// The first report registers; one member's first try fails and is retried with backoff.
	lb.fail("register", 1)
	s.reportAll()
	s.run(t)
	require.Len(t, members(), 2, "one registration failed")
	for _, id := range ids {
		if _, ok := members()[id]; !ok {
			st := lbStatus(id)
			require.Equal(t, nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_PENDING, st.GetState())
			require.Contains(t, st.GetLastError(), "injected register failure")
		}
	}
	s.advance(t, 1500*time.Millisecond) // the first retry is due after 1s ± jitter
	want := map[string]loadbalancer.MemberState{}
	for _, id := range ids {
		want[id] = loadbalancer.MemberActive
		rec, _ := s.insts.Get(id)
		require.NotNil(t, rec.LoadBalancers["www"].Registered, id)
	}
	require.Equal(t, want, members())
	st := lbStatus(ids[0])
	require.Equal(t, nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_REGISTERED, st.GetState())
	require.Empty(t, st.GetLastError(), "a success clears the error")
	_ = drain(sub.Events())

	// Scale down: the removed member is deregistered first, its drain held for the delay.
	s.upsert(t, "web", 2, time.Minute)
	var victim string
	for _, id := range ids {
		if rec, _ := s.insts.Get(id); rec.State == instances.StatePendingDeletion {
			victim = id
		}
	}
	require.NotEmpty(t, victim)
	rec, _ := s.insts.Get(victim)
	require.True(t, rec.DrainHeld)
	require.Nil(t, s.ops.Status(rec).GetDrainDeadline(), "a held drain shows no deadline")
	require.Equal(t, nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_DEREGISTERING, lbStatus(victim).GetState())
	require.Equal(t, loadbalancer.MemberDraining, members()[victim])
	for _, ev := range drain(sub.Events()) {
		require.NotEqual(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus(),
			"no drain is announced while the member is deregistering")
	}
	s.advance(t, 19*time.Second)
	require.Equal(t, loadbalancer.MemberDraining, members()[victim], "removed only after the 20s delay")
	lb.fail("remove", 1)
	s.advance(t, 2*time.Second)
	require.Equal(t, loadbalancer.MemberDraining, members()[victim], "the failed removal waits for its retry")
	rec, _ = s.insts.Get(victim)
	require.True(t, rec.DrainHeld, "the drain waits for the removal")
	retryFrom := s.clk.Now()
	s.advance(t, 1500*time.Millisecond)
	require.NotContains(t, members(), victim)
	rec, _ = s.insts.Get(victim)
	require.False(t, rec.DrainHeld)
	require.WithinRange(t, *rec.DrainDeadline, retryFrom.Add(time.Minute), s.clk.Now().Add(time.Minute), "the drain deadline runs from the release")
	var announced bool
	for _, ev := range drain(sub.Events()) {
		if ev.GetInstanceId() == victim && ev.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION {
			announced = true
		}
	}
	require.True(t, announced, "the drain is announced once the member is out of the load balancer")
	lb.mu.Lock()
	var order []string
	for _, c := range lb.calls {
		if c == "deregister "+victim || c == "remove "+victim {
			order = append(order, c)
		}
	}
	lb.mu.Unlock()
	require.Equal(t, []string{"deregister " + victim, "remove " + victim, "remove " + victim}, order)
	for range 7 { // the members keep reporting while the drain deadline passes
		s.reportAll()
		s.advance(t, 10*time.Second)
	}
	_, ok := s.insts.Get(victim)
	require.False(t, ok, "deleted after its drain deadline")

	// Behind the leader's back: one member removed, a stranger with our prefix added.
	s.term.End()
	left := s.ids("web")
	require.Len(t, left, 2)
	p := real.(*haproxy.Provider)
	out := haproxyCommand(t, h.Socket, "set server www/"+p.ServerName(left[0])+" state maint")
	require.Empty(t, strings.TrimSpace(out))
	require.Contains(t, haproxyCommand(t, h.Socket, "del server www/"+p.ServerName(left[0])), "Server deleted")
	require.Contains(t, haproxyCommand(t, h.Socket, "add server www/"+p.ServerName("web-deadbeef")+" 127.0.0.1:8080"), "New server registered")
	require.Equal(t, map[string]loadbalancer.MemberState{left[1]: loadbalancer.MemberActive, "web-deadbeef": loadbalancer.MemberInactive}, members())

	s.startTerm(t)
	s.reportAll()
	s.run(t)
	require.Equal(t, map[string]loadbalancer.MemberState{left[0]: loadbalancer.MemberActive, left[1]: loadbalancer.MemberActive}, members(),
		"the new term converges the backend to the group's members")
	require.Regexp(t, `(?m)^\d+ www \d+ static1 127\.0\.0\.1 0 5 `, haproxyCommand(t, h.Socket, "show servers state www"),
		"the foreign server is untouched")
}
