package reconcile_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestCreateRateLimit(t *testing.T) {
	s := newShard(t, newShardConfig(t).createRate(120, 2).build(t), shardOptions{})
	s.upsert(t, "web", 5, 0)
	require.Equal(t, 2, s.insts.Len(), "the burst")
	// Then one every 500ms (120 a minute), never sooner.
	for want := 3; want <= 5; want++ {
		s.advance(t, 499*time.Millisecond)
		require.Equal(t, want-1, s.insts.Len(), "1ms before the next token")
		s.advance(t, time.Millisecond)
		require.Equal(t, want, s.insts.Len())
	}
	require.Len(t, s.running("web"), 5)
}

func TestForcedExpiryReplacesInstances(t *testing.T) {
	s := newShard(t, newShardConfig(t).expiry(config.Expiry{ForcedAge: config.Duration(time.Second)}).build(t), shardOptions{})
	sub := s.events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	s.upsert(t, "web", 2, 50*time.Millisecond)
	first := s.ids("web")
	require.Len(t, s.running("web"), 2)
	s.advance(t, 999*time.Millisecond)
	require.ElementsMatch(t, first, s.ids("web"), "nothing expires before forced_age")
	s.advance(t, time.Millisecond)
	var pending []string
	for _, ev := range drain(sub.Events()) {
		if ev.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION {
			require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, ev.GetReason())
			pending = append(pending, ev.GetInstanceId())
		}
	}
	require.ElementsMatch(t, first, pending, "both reached forced_age and go at once")
	s.advance(t, 50*time.Millisecond)
	now := s.running("web")
	require.Len(t, now, 2)
	for _, r := range now {
		require.NotContains(t, first, r.ID)
	}
}

func TestEligibleExpiryReplacesOneAtATime(t *testing.T) {
	s := newShard(t, newShardConfig(t).expiry(config.Expiry{EligibleAge: config.Duration(500 * time.Millisecond)}).build(t), shardOptions{})
	sub := s.events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	s.upsert(t, "web", 3, 200*time.Millisecond)
	first := s.ids("web")
	pendingNow, seen := 0, map[string]bool{}
	for step := 0; step < 100 && len(seen) < 3; step++ {
		s.advance(t, 10*time.Millisecond)
		for _, ev := range drain(sub.Events()) {
			switch ev.GetStatus() {
			case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION:
				require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, ev.GetReason())
				pendingNow++
				require.Equal(t, 1, pendingNow, "only one eligible instance is replaced at a time")
				seen[ev.GetInstanceId()] = true
			case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED:
				pendingNow--
			}
		}
	}
	require.Len(t, seen, 3, "every member was replaced within a second")
	for _, id := range first {
		require.True(t, seen[id], "the first members go first (oldest)")
	}
}

func TestStoppedWorkloadIsReplaced(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	errs := s.events.Errors.Subscribe("t")
	t.Cleanup(errs.Close)
	s.upsert(t, "web", 1, 50*time.Millisecond)
	victim := s.running("web")[0].ID
	s.p.Stop(victim)
	s.advance(t, 100*time.Millisecond) // the resync notices
	evs := drain(errs.Events())
	require.NotEmpty(t, evs)
	require.Equal(t, victim, evs[0].GetInstanceId())
	require.Contains(t, evs[0].GetMessage(), "stopped")
	// The replacement was created at once; the next resync sees it ready and
	// retires the stopped member, whose drain deadline follows.
	s.advance(t, 150*time.Millisecond)
	r := s.running("web")
	require.Len(t, r, 1)
	require.NotEqual(t, victim, r[0].ID)
	_, exists := s.insts.Get(victim)
	require.False(t, exists)
}

func TestPendingRecordFromACrashIsLaunchedNotDuplicated(t *testing.T) {
	var orphanID string
	s := newShard(t, newShardConfig(t).build(t), shardOptions{prepare: func(s *shard) {
		ctx := context.Background()
		_, err := s.groups.Load(ctx)
		require.NoError(t, err)
		_, _, err = s.groups.Upsert(ctx, groups.Key{Tenant: "t", ID: "web"}, groups.Spec{Template: "worker", Size: 1}, "")
		require.NoError(t, err)
		orphanID, _ = instances.NewID("web")
		require.NoError(t, s.insts.Create(ctx, &instances.Record{ID: orphanID, Tenant: "t", GroupID: "web", Shard: "s1",
			ProviderID: provider.ID("c1", "s1", orphanID), State: instances.StatePending, Template: "worker", InstanceType: "test.small",
			SubnetPool: "default", CreatedAt: epoch}))
	}})
	s.run(t)
	s.advance(t, 300*time.Millisecond)
	r := s.running("web")
	require.Len(t, r, 1)
	require.Equal(t, orphanID, r[0].ID)
	creates, _ := s.p.Counts()
	require.Equal(t, 1, creates)
}

// TestRapidChangesAreNeverLost: resizes from many goroutines while the
// queue is being processed are coalesced, never dropped.
func TestRapidChangesAreNeverLost(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	var wg sync.WaitGroup
	errs := make(chan error, 20*16)
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("g%02d", g)
			for i := 0; i < 16; i++ {
				size := uint32((i*7 + g) % 5)
				if i == 15 {
					size = uint32(g%4 + 1)
				}
				_, _, err := s.ops.UpsertGroup(context.Background(), "t", &nstancev1.GroupSpec{GroupId: id, Template: "worker", Size: size}, "")
				errs <- err
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		s.term.RunUntilIdle(t)
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	s.advance(t, time.Minute) // drains of the removed members time out (default 30s)
	want := 0
	for g := 0; g < 20; g++ {
		id := fmt.Sprintf("g%02d", g)
		require.Len(t, s.ids(id), g%4+1, "group %s ends at its last requested size", id)
		require.Len(t, s.running(id), g%4+1)
		want += g%4 + 1
	}
	list, err := s.p.List(context.Background())
	require.NoError(t, err)
	require.Len(t, list, want, "no provider instance leaked")
}

func TestHealthProblemsAreReplacedFirst(t *testing.T) {
	cases := []struct {
		name   string
		act    func(s *shard, victim string)
		reason nstancev1.DeletionReason
		errMsg string // regular expression; a group captures the missed reports
	}{
		{"missed reports", func(s *shard, victim string) { s.agents.silence(victim) },
			nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, `missed (\d+) health reports`},
		{"spot termination notice", func(s *shard, victim string) {
			s.agents.report(victim, &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SPOT})
		}, nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION, ""},
		{"provider stopped the instance", func(s *shard, victim string) { s.p.Stop(victim) },
			nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, "stopped"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const misses = 3
			s := newShard(t, newShardConfig(t).health(100*time.Millisecond, misses, 2*time.Second).build(t), shardOptions{monitor: true})
			insts := s.events.Instances.Subscribe("t")
			t.Cleanup(insts.Close)
			errs := s.events.Errors.Subscribe("t")
			t.Cleanup(errs.Close)
			s.upsert(t, "web", 2, 50*time.Millisecond)
			require.Equal(t, 0, s.ready(t, "web"), "no agent reported yet")
			s.reportAll()
			s.run(t)
			require.Equal(t, 2, s.ready(t, "web"))
			initial := s.ids("web")
			victim := initial[0]
			tc.act(s, victim)
			s.run(t)

			// Agents report every 100ms; step until the victim is announced.
			var ev *nstancev1.InstanceEvent
			var errEvs []*nstancev1.ErrorEvent
			for step := 0; step < 50 && ev == nil; step++ {
				s.advance(t, 100*time.Millisecond)
				errEvs = append(errEvs, drain(errs.Events())...)
				if evs := drain(insts.Events()); len(evs) > 0 {
					ev = evs[0] // the drain deadline may follow in the same step
				}
				s.reportAll()
			}
			require.NotNil(t, ev, "the victim was announced")
			require.Equal(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus())
			require.Equal(t, victim, ev.GetInstanceId())
			require.Equal(t, tc.reason, ev.GetReason())
			if tc.errMsg != "" {
				require.NotEmpty(t, errEvs)
				require.Equal(t, victim, errEvs[0].GetInstanceId())
				m := regexp.MustCompile(tc.errMsg).FindStringSubmatch(errEvs[0].GetMessage())
				require.NotNil(t, m, "%q does not match %q", errEvs[0].GetMessage(), tc.errMsg)
				if len(m) > 1 {
					n, err := strconv.Atoi(m[1])
					require.NoError(t, err)
					require.Equal(t, misses, n, "unhealthy at exactly health_misses missed reports")
				}
			}
			// The replacement exists and reported by the time the victim is announced.
			var fresh []string
			for _, id := range s.ids("web") {
				if id != initial[0] && id != initial[1] {
					fresh = append(fresh, id)
				}
			}
			require.Len(t, fresh, 1)
			_, reported := s.agents.LastReport(fresh[0])
			require.True(t, reported, "replacement reported before the victim was drained")
			s.advance(t, 50*time.Millisecond) // the drain deadline
			_, there := s.insts.Get(victim)
			require.False(t, there)
			require.Equal(t, 2, s.ready(t, "web"))
			require.Contains(t, s.agents.forgot, victim, "health state of a deleted instance is dropped")
		})
	}
}

// TestLateHealthPassAsksTheProviderFirst: a health pass that runs late sees
// every missed report at once. When the workload is gone (a killed agent's VM),
// the instance must be recorded as stopped, not merely called unhealthy. The
// clock jumps past health_misses intervals in one step and periodic resyncs
// are off, so only the health pass can notice.
func TestLateHealthPassAsksTheProviderFirst(t *testing.T) {
	const interval = 100 * time.Millisecond
	s := newShard(t, newShardConfig(t).health(interval, 3, time.Hour).build(t), shardOptions{monitor: true, resync: time.Hour})
	errs := s.events.Errors.Subscribe("t")
	t.Cleanup(errs.Close)
	s.upsert(t, "web", 1, 50*time.Millisecond)
	s.reportAll()
	s.run(t)
	require.Equal(t, 1, s.ready(t, "web"))
	victim := s.running("web")[0].ID

	s.agents.silence(victim)
	s.p.Stop(victim)
	s.clk.Step(10 * interval)
	s.term.HealthPass(t)

	evs := drain(errs.Events())
	require.NotEmpty(t, evs, "an error event for the stopped instance")
	require.Equal(t, victim, evs[0].GetInstanceId())
	require.Contains(t, evs[0].GetMessage(), "instance stopped", "the provider's answer wins over the missed-report count")
	for _, ev := range evs {
		require.NotContains(t, ev.GetMessage(), "missed", "never called unhealthy")
	}
	rec, ok := s.insts.Get(victim)
	require.True(t, ok, "the group replaces it first")
	require.True(t, rec.WorkloadGone, "a stopped workload is recorded as gone (the operator skips its drain)")
	require.Equal(t, instances.StateStopped, rec.State)
}

// TestFailedDeletionHoldsTheCreatesBack: the plan counts on its deletions;
// when one cannot be recorded, nothing is created (the group would run
// above its size) and the group is retried with backoff.
func TestFailedDeletionHoldsTheCreatesBack(t *testing.T) {
	s := newShard(t, newShardConfig(t).expiry(config.Expiry{ForcedAge: config.Duration(time.Minute)}).build(t), shardOptions{resync: time.Hour})
	s.upsert(t, "web", 2, 50*time.Millisecond)
	first := s.ids("web")
	require.Len(t, first, 2)
	creates, _ := s.p.Counts()
	// Only the existing members' records fail: a new record would be written.
	s.failWrites(func(key string) bool { return strings.Contains(key, first[0]) || strings.Contains(key, first[1]) })
	s.clk.Step(time.Minute)
	s.term.Resync(t)
	after, _ := s.p.Counts()
	require.Equal(t, creates, after, "no replacement while its member's deletion failed")
	require.ElementsMatch(t, first, s.ids("web"))
	require.Positive(t, s.term.Waiting(), "the group waits for its retry")
	s.failWrites(nil)
	s.advance(t, time.Second) // the retry, then the drain deadlines
	for _, id := range s.ids("web") {
		require.NotContains(t, first, id, "both expired members were replaced")
	}
	require.Len(t, s.running("web"), 2)
}

// TestAgentVersionRecorded: the agent version of a report lands on the
// instance record (the status page and ListInstances show it), and a new
// version is written at once, not only at the throttled health write.
func TestAgentVersionRecorded(t *testing.T) {
	s := newShard(t, newShardConfig(t).health(100*time.Millisecond, 3, time.Hour).build(t), shardOptions{monitor: true, resync: time.Hour})
	s.upsert(t, "web", 1, 50*time.Millisecond)
	id := s.running("web")[0].ID
	s.agents.mu.Lock()
	s.agents.version[id] = "v1.2.0"
	s.agents.mu.Unlock()
	s.reportAll()
	// Known from the report (as readiness is), before the record is written.
	before, ok := s.insts.Get(id)
	require.True(t, ok)
	require.Empty(t, before.AgentVersion)
	listed := s.ops.ListInstances(before.Tenant, nil, nil, false)
	require.Len(t, listed, 1)
	require.Equal(t, "v1.2.0", listed[0].GetAgentVersion())
	require.Equal(t, "v1.2.0", s.ops.Status(before).GetAgentVersion())
	s.run(t)
	rec, ok := s.insts.Get(id)
	require.True(t, ok)
	require.Equal(t, "v1.2.0", rec.AgentVersion)
	require.Equal(t, "v1.2.0", rec.Proto().GetAgentVersion())
	// The first report recorded starts the join deadline and stays put.
	require.NotNil(t, rec.FirstHealthAt)
	require.Equal(t, *rec.LastHealthAt, *rec.FirstHealthAt)
	first := *rec.FirstHealthAt
	require.True(t, rec.Proto().GetFirstHealthAt().AsTime().Equal(first))

	s.agents.mu.Lock()
	s.agents.version[id] = "v1.3.0"
	s.agents.mu.Unlock()
	s.reportAll() // within the health write throttle: only the version is new
	s.run(t)
	rec, _ = s.insts.Get(id)
	require.Equal(t, "v1.3.0", rec.AgentVersion)
	require.Equal(t, first, *rec.FirstHealthAt)
}
