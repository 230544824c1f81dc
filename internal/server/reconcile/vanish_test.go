package reconcile_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/instances"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// vanishShard is a shard whose health rule is slow (10 s reports, 3
// misses) and whose periodic pass is off, so that only the signs of a VM
// going away (a lost stream, a reported shutdown) can act within the test's
// few simulated seconds. Group web has two members, each with an open
// stream and a report.
func vanishShard(t *testing.T, grace time.Duration) (s *shard, members []string, release map[string]func()) {
	t.Helper()
	cfg := newShardConfig(t).health(10*time.Second, 3, time.Hour).shutdownGrace(grace).build(t)
	s = newShard(t, cfg, shardOptions{monitor: true, resync: time.Hour})
	s.upsert(t, "web", 2, 50*time.Millisecond)
	release = map[string]func(){}
	for _, id := range s.ids("web") {
		release[id] = s.agents.connect(id)
	}
	s.reportAll()
	s.run(t)
	require.Equal(t, 2, s.ready(t, "web"))
	return s, s.ids("web"), release
}

// others lists the group's members that are not among ids.
func (s *shard) others(group string, ids []string) []string {
	var out []string
	for _, id := range s.ids(group) {
		if !slices.Contains(ids, id) {
			out = append(out, id)
		}
	}
	return out
}

// TestLostStreamOfAGoneVMReplacesAtOnce: the agent's connection breaks
// because its VM was killed; the server asks the provider at once, without
// waiting for a missed report, and the replacement is created with no time
// passing at all.
func TestLostStreamOfAGoneVMReplacesAtOnce(t *testing.T) {
	s, members, release := vanishShard(t, time.Minute)
	victim := members[0]
	creates, _ := s.p.Counts()

	s.p.Vanish(victim)
	release[victim]()
	s.run(t) // no clock step

	now, _ := s.p.Counts()
	require.Equal(t, creates+1, now, "the replacement was created in the same instant")
	_, there := s.insts.Get(victim)
	require.False(t, there, "the vanished instance's record is gone")
	require.Len(t, s.others("web", members), 1)
}

// TestLostStreamOfAStoppingVMReplacesWhenTheProviderSeesIt: the VM is
// still running when the stream breaks (it shuts down) and stops 700 ms
// later; the checks that follow the break see it within their pacing, long
// before the health rule's 30 s.
func TestLostStreamOfAStoppingVMReplacesWhenTheProviderSeesIt(t *testing.T) {
	s, members, release := vanishShard(t, time.Minute)
	victim := members[0]
	release[victim]()
	s.run(t)
	s.advance(t, 700*time.Millisecond)
	require.Empty(t, s.others("web", members), "nothing replaced while the provider says it runs")

	s.p.Stop(victim)
	start := s.clk.Now()
	for len(s.others("web", members)) == 0 {
		require.Less(t, s.clk.Since(start), 2*time.Second, "the stop was seen within the checks' pacing")
		s.advance(t, 50*time.Millisecond)
	}
	rec, ok := s.insts.Get(victim)
	require.True(t, ok, "the stopped member stays until its replacement runs")
	require.Equal(t, instances.StateStopped, rec.State)
}

// TestAgentRestartOnALivingVMReplacesNothing: an agent that restarts (an
// upgrade, Air rebuilding it) breaks its stream and comes back; the
// provider says the VM runs throughout. Nothing is replaced, and the
// checks stop once the agent is back.
func TestAgentRestartOnALivingVMReplacesNothing(t *testing.T) {
	s, members, release := vanishShard(t, time.Minute)
	victim := members[0]
	release[victim]()
	s.run(t)
	s.advance(t, 1500*time.Millisecond)
	s.agents.connect(victim)
	s.agents.report(victim, nil)
	s.run(t)
	before := s.p.Statuses()
	creates, _ := s.p.Counts()
	for range 60 { // 60 s: past the health rule's window, reporting as agents do
		s.advance(t, time.Second)
		s.reportAll()
	}
	now, _ := s.p.Counts()
	require.Equal(t, creates, now, "no replacement")
	require.Equal(t, members, s.ids("web"))
	require.Less(t, s.p.Statuses()-before, 10, "the provider is no longer asked every few hundred ms once the agent is back")
}

// TestShutdownReport covers an agent that says its host is going down.
func TestShutdownReport(t *testing.T) {
	shutdown := &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN, Message: "systemd is stopping"}

	t.Run("the provider confirms: replaced at once", func(t *testing.T) {
		s, members, release := vanishShard(t, time.Minute)
		victim := members[0]
		s.agents.report(victim, shutdown)
		release[victim]()
		s.run(t)
		require.Empty(t, s.others("web", members), "running at the provider: not yet")
		s.advance(t, 200*time.Millisecond)
		s.p.Stop(victim)
		start := s.clk.Now()
		for len(s.others("web", members)) == 0 {
			require.Less(t, s.clk.Since(start), time.Second, "the stop was seen within the checks' pacing")
			s.advance(t, 10*time.Millisecond)
		}
	})

	t.Run("the provider cannot tell: replaced after the grace", func(t *testing.T) {
		const grace = 5 * time.Second
		s, members, _ := vanishShard(t, grace)
		victim := members[0]
		insts := s.events.Instances.Subscribe("t")
		t.Cleanup(insts.Close)
		s.agents.report(victim, shutdown)
		s.run(t)
		s.advance(t, grace-100*time.Millisecond)
		require.Empty(t, s.others("web", members), "within the grace the member stays")
		rec, _ := s.insts.Get(victim)
		require.Equal(t, instances.StateRunning, rec.State)

		s.advance(t, 200*time.Millisecond)
		rec, _ = s.insts.Get(victim)
		require.Equal(t, instances.StateUnhealthy, rec.State)
		require.Contains(t, rec.Message, "shutdown_grace")
		require.Len(t, s.others("web", members), 1, "replaced first")
		s.reportAll()
		s.advance(t, 100*time.Millisecond)
		var announced bool
		for _, ev := range drain(insts.Events()) {
			if ev.GetInstanceId() == victim && ev.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION {
				announced = true
				require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, ev.GetReason())
			}
		}
		require.True(t, announced, "the member goes once its replacement is ready")
	})

	t.Run("the agent comes back without it: nothing replaced", func(t *testing.T) {
		const grace = 5 * time.Second
		s, members, _ := vanishShard(t, grace)
		victim := members[0]
		s.agents.report(victim, shutdown)
		s.run(t)
		s.advance(t, time.Second)
		s.agents.report(victim, nil) // restarted; the host stayed up
		s.run(t)
		for range 10 {
			s.advance(t, time.Second)
			s.reportAll()
		}
		require.Equal(t, members, s.ids("web"))
		rec, _ := s.insts.Get(victim)
		require.Equal(t, instances.StateRunning, rec.State)
	})
}

// TestLostStreamsAllAtOncePaceTheProvider: a network blip drops every
// agent's stream while the VMs run on. Each instance is checked once at
// once; the checks after that share one pace (probeRate per second after
// a burst), not a few per second each for as long as the agents stay
// away.
func TestLostStreamsAllAtOncePaceTheProvider(t *testing.T) {
	const n = 250
	cfg := newShardConfig(t).health(10*time.Second, 3, time.Hour).limits(func(l *config.Limits) { l.TenantCreateRate = config.RateLimit{PerMinute: 100000, Burst: 1000} }).build(t)
	s := newShard(t, cfg, shardOptions{monitor: true, resync: time.Hour})
	s.upsert(t, "web", n, 50*time.Millisecond)
	var release []func()
	for _, id := range s.ids("web") {
		release = append(release, s.agents.connect(id))
	}
	s.reportAll()
	s.run(t)
	require.Equal(t, n, s.ready(t, "web"))
	before := s.p.Statuses()
	for _, r := range release {
		r()
	}
	s.run(t)
	require.Equal(t, n, s.p.Statuses()-before, "every instance asked once, at once")
	// 9 s: before the first missed report (10 s) asks about every
	// instance again on its own account.
	s.advance(t, 9*time.Second)
	calls := s.p.Statuses() - before
	t.Logf("%d provider checks in 9 s for %d lost streams", calls, n)
	require.LessOrEqual(t, calls, n+200+20*9+5, "the rechecks share one pace (unpaced: about 8 per instance)")
	require.Equal(t, n, len(s.ids("web")), "nothing replaced: the VMs run")
}
