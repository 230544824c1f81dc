package reconcile_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

type env struct {
	f     *app.Assembly
	p     *mock.Provider
	store objstore.Store
}

// start runs a fleet over cfgEdit(test config); prepare runs before Run.
func start(t *testing.T, cfgEdit func(string) string, prepare func(*app.Assembly)) env {
	t.Helper()
	text := shardtest.Config("c1", "s1", "mock")
	if cfgEdit != nil {
		text = cfgEdit(text)
	}
	cfg, err := config.Parse([]byte(text))
	require.NoError(t, err)
	store := memstore.New()
	p := mock.New()
	f, err := app.Assemble(app.Parts{Store: store, Keys: layout.New(""), Config: cfg, ConfigETag: "e1", ConfigModified: time.Now(),
		Provider: p, Tuning: app.Tuning{ResyncInterval: 100 * time.Millisecond, RetryBase: 20 * time.Millisecond}})
	require.NoError(t, err)
	if prepare != nil {
		prepare(f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Lead(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, f.Reconciler.Running, 5*time.Second, time.Millisecond)
	return env{f: f, p: p, store: store}
}

func shardEdit(extra string) func(string) string {
	return func(s string) string {
		return strings.Replace(s, `"default_drain_timeout": "30s",`, `"default_drain_timeout": "30s", `+extra, 1)
	}
}

func upsert(t *testing.T, e env, id string, size uint32, drain time.Duration) {
	t.Helper()
	spec := &nstancev1.GroupSpec{GroupId: id, Template: "worker", Size: size}
	if drain > 0 {
		spec.DrainTimeout = durationpbOf(drain)
	}
	_, _, err := e.f.Reconciler.UpsertGroup(context.Background(), "t", spec, "")
	require.NoError(t, err)
}

func running(e env, group string) []*instances.Record {
	var out []*instances.Record
	for _, r := range e.f.Instances.ListGroup("t", group) {
		if r.State == instances.StateRunning {
			out = append(out, r)
		}
	}
	return out
}

func TestCreateRateLimit(t *testing.T) {
	e := start(t, shardEdit(`"create_rate_limit": { "per_minute": 120, "burst": 2 },`), nil)
	began := time.Now()
	upsert(t, e, "web", 5, 0)
	// However late this goroutine gets to look (a loaded machine), the
	// creates seen never exceed the burst plus 2 per second since began:
	// each count is compared with the time measured after it was read.
	var over []string
	require.Eventually(t, func() bool {
		n := e.f.Instances.Len()
		elapsed := time.Since(began)
		if allowed := 2 + int(elapsed/(500*time.Millisecond)); n > allowed {
			over = append(over, fmt.Sprintf("%d creates after %s (at most %d)", n, elapsed, allowed))
		}
		return len(running(e, "web")) == 5
	}, 10*time.Second, 10*time.Millisecond)
	require.Empty(t, over, "burst of 2, then 2 per second")
	require.GreaterOrEqual(t, time.Since(began), 1400*time.Millisecond, "three more creates at 2/s take at least 1.5s")
}

func TestForcedExpiryReplacesInstances(t *testing.T) {
	e := start(t, shardEdit(`"expiry": { "forced_age": "1s" },`), nil)
	sub := e.f.Events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	upsert(t, e, "web", 2, 50*time.Millisecond)
	require.Eventually(t, func() bool { return len(running(e, "web")) == 2 }, 5*time.Second, 10*time.Millisecond)
	first := running(e, "web")
	ev := <-sub.Events()
	require.Equal(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus())
	require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, ev.GetReason())
	require.Contains(t, []string{first[0].ID, first[1].ID}, ev.GetInstanceId())
	require.Eventually(t, func() bool {
		now := running(e, "web")
		return len(now) == 2 && now[0].ID != first[0].ID && now[0].ID != first[1].ID && now[1].ID != first[0].ID && now[1].ID != first[1].ID
	}, 5*time.Second, 10*time.Millisecond)
}

func TestEligibleExpiryReplacesOneAtATime(t *testing.T) {
	e := start(t, shardEdit(`"expiry": { "eligible_age": "500ms" },`), nil)
	sub := e.f.Events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	upsert(t, e, "web", 3, 200*time.Millisecond)
	pendingNow := 0
	deadline := time.After(3 * time.Second)
	seen := 0
	for seen < 3 {
		select {
		case ev := <-sub.Events():
			switch ev.GetStatus() {
			case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION:
				require.Equal(t, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, ev.GetReason())
				pendingNow++
				require.Equal(t, 1, pendingNow, "only one eligible instance is replaced at a time")
				seen++
			case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED:
				pendingNow--
			}
		case <-deadline:
			t.Fatalf("only %d eligible replacements seen", seen)
		}
	}
}

func TestStoppedWorkloadIsReplaced(t *testing.T) {
	e := start(t, nil, nil)
	errs := e.f.Events.Errors.Subscribe("t")
	t.Cleanup(errs.Close)
	upsert(t, e, "web", 1, 50*time.Millisecond)
	require.Eventually(t, func() bool { return len(running(e, "web")) == 1 }, 5*time.Second, 10*time.Millisecond)
	victim := running(e, "web")[0].ID
	e.p.Stop(victim)
	ev := <-errs.Events()
	require.Equal(t, victim, ev.GetInstanceId())
	require.Contains(t, ev.GetMessage(), "stopped")
	require.Eventually(t, func() bool {
		r := running(e, "web")
		_, gone := e.f.Instances.Get(victim)
		return len(r) == 1 && r[0].ID != victim && !gone
	}, 5*time.Second, 10*time.Millisecond)
}

func TestPendingRecordFromACrashIsLaunchedNotDuplicated(t *testing.T) {
	var orphanID string
	e := start(t, nil, func(f *app.Assembly) {
		ctx := context.Background()
		_, err := f.Groups.Load(ctx)
		require.NoError(t, err)
		_, _, err = f.Groups.Upsert(ctx, groups.Key{Tenant: "t", ID: "web"}, groups.Spec{Template: "worker", Size: 1}, "")
		require.NoError(t, err)
		orphanID, _ = instances.NewID("web")
		require.NoError(t, f.Instances.Create(ctx, &instances.Record{ID: orphanID, Tenant: "t", GroupID: "web", Shard: "s1",
			ProviderID: provider.ID("c1", "s1", orphanID), State: instances.StatePending, Template: "worker", InstanceType: "test.small",
			SubnetPool: "default", CreatedAt: time.Now()}))
	})
	require.Eventually(t, func() bool { return len(running(e, "web")) == 1 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	r := running(e, "web")
	require.Len(t, r, 1)
	require.Equal(t, orphanID, r[0].ID)
	creates, _ := e.p.Counts()
	require.Equal(t, 1, creates)
}

func TestRapidChangesAreNeverLost(t *testing.T) {
	e := start(t, nil, nil)
	var wg sync.WaitGroup
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("g%02d", g)
			for i := 0; i < 15; i++ {
				upsert(t, e, id, uint32((i*7+g)%5), time.Millisecond)
			}
			upsert(t, e, id, uint32(g%4+1), time.Millisecond)
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		for g := 0; g < 20; g++ {
			id := fmt.Sprintf("g%02d", g)
			if len(e.f.Instances.ListGroup("t", id)) != g%4+1 || len(running(e, id)) != g%4+1 {
				return false
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "every group ends at its last requested size")
	list, err := e.p.List(context.Background())
	require.NoError(t, err)
	want := 0
	for g := 0; g < 20; g++ {
		want += g%4 + 1
	}
	require.Len(t, list, want, "no provider instance leaked")
}

// reporter feeds health reports for a fleet's active instances, as agents would.
type reporter struct {
	mu      sync.Mutex
	silent  map[string]bool
	notices map[string]*nstancev1.TerminationNotice
}

func (rp *reporter) run(ctx context.Context, f *app.Assembly) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Millisecond):
		}
		for _, rec := range f.Instances.List(func(r *instances.Record) bool { return r.State.Active() }) {
			rp.mu.Lock()
			silent, notice := rp.silent[rec.ID], rp.notices[rec.ID]
			rp.mu.Unlock()
			if !silent {
				_ = f.Health.RecordHealth(ctx, agentapi.Ref{InstanceID: rec.ID, Tenant: rec.Tenant, Group: rec.GroupID},
					&nstancev1.HealthReport{Termination: notice}, time.Now())
			}
		}
	}
}

// healthMisses is the unhealthy threshold of the health tests, 1s at the
// 100ms interval: the reporter reports every 30ms, and with 3 misses (300ms)
// a loaded machine that ran the health pass before the reporter after a
// pause got a healthy instance called unhealthy.
const healthMisses = 10

func TestHealthProblemsAreReplacedFirst(t *testing.T) {
	ca, err := pki.GenerateWorkloadCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	cases := []struct {
		name   string
		act    func(rp *reporter, p *mock.Provider, victim string)
		reason nstancev1.DeletionReason
		errMsg string // regular expression; a group captures the missed reports
	}{
		{"missed reports", func(rp *reporter, _ *mock.Provider, victim string) {
			rp.mu.Lock()
			rp.silent[victim] = true
			rp.mu.Unlock()
		}, nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, `missed (\d+) health reports`},
		{"spot termination notice", func(rp *reporter, _ *mock.Provider, victim string) {
			rp.mu.Lock()
			rp.notices[victim] = &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SPOT}
			rp.mu.Unlock()
		}, nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION, ""},
		{"provider stopped the instance", func(_ *reporter, p *mock.Provider, victim string) { p.Stop(victim) },
			nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, "stopped"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rp := &reporter{silent: map[string]bool{}, notices: map[string]*nstancev1.TerminationNotice{}}
			cfg, err := config.Parse([]byte(shardtest.Config("c1", "s1", "mock")))
			require.NoError(t, err)
			store := memstore.New()
			p := mock.New()
			f, err := app.Assemble(app.Parts{Store: store, Keys: layout.New(""), Config: cfg, ConfigETag: "e1", ConfigModified: time.Now(),
				Provider: p, WorkloadCA: ca, Tuning: app.Tuning{ResyncInterval: 100 * time.Millisecond, RetryBase: 20 * time.Millisecond,
					MonitorMock: true, HealthInterval: 100 * time.Millisecond, HealthMisses: healthMisses, StartupGrace: 2 * time.Second}})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- f.Lead(ctx) }()
			go rp.run(ctx, f)
			t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
			require.Eventually(t, f.Reconciler.Running, 5*time.Second, time.Millisecond)
			insts := f.Events.Instances.Subscribe("t")
			t.Cleanup(insts.Close)
			errs := f.Events.Errors.Subscribe("t")
			t.Cleanup(errs.Close)
			e := env{f: f, p: p, store: store}
			upsert(t, e, "web", 2, 50*time.Millisecond)
			ready := func() int { return int(f.Reconciler.GroupStatus(mustGroup(t, f, "web")).GetReadyCount()) }
			require.Eventually(t, func() bool { return ready() == 2 }, 5*time.Second, 10*time.Millisecond)
			initial := map[string]bool{}
			for _, r := range running(e, "web") {
				initial[r.ID] = true
			}
			victim := running(e, "web")[0].ID
			tc.act(rp, p, victim)
			if tc.errMsg != "" {
				ev := <-errs.Events()
				require.Equal(t, victim, ev.GetInstanceId())
				m := regexp.MustCompile(tc.errMsg).FindStringSubmatch(ev.GetMessage())
				require.NotNil(t, m, "%q does not match %q", ev.GetMessage(), tc.errMsg)
				if len(m) > 1 {
					// A health pass that runs late counts more than the limit.
					n, err := strconv.Atoi(m[1])
					require.NoError(t, err)
					require.GreaterOrEqual(t, n, healthMisses)
				}
			}
			var ev *nstancev1.InstanceEvent
			select {
			case ev = <-insts.Events():
			case <-time.After(10 * time.Second):
				t.Fatal("no instance event")
			}
			require.Equal(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus())
			require.Equal(t, victim, ev.GetInstanceId())
			require.Equal(t, tc.reason, ev.GetReason())
			// The replacement exists and reports by the time the victim is announced.
			var fresh []string
			for _, r := range f.Instances.ListGroup("t", "web") {
				if !initial[r.ID] {
					fresh = append(fresh, r.ID)
				}
			}
			require.Len(t, fresh, 1)
			_, reported := f.Health.LastReport(fresh[0])
			require.True(t, reported, "replacement reported before the victim was drained")
			require.Eventually(t, func() bool {
				_, there := f.Instances.Get(victim)
				return !there && ready() == 2
			}, 5*time.Second, 10*time.Millisecond)
			_, known := f.Health.LastReport(victim)
			require.False(t, known, "health state of a deleted instance is dropped")
		})
	}
}

func mustGroup(t *testing.T, f *app.Assembly, id string) *groups.Group {
	t.Helper()
	g, ok := f.Groups.Get(groups.Key{Tenant: "t", ID: id})
	require.True(t, ok)
	return g
}

// TestLateHealthPassAsksTheProviderFirst: a health pass that runs late sees
// every missed report at once. When the workload is gone (a killed agent's VM),
// the instance must be recorded as stopped, not merely called unhealthy. The
// clock jumps past HealthMisses intervals in one step and periodic resyncs are
// off, so only the health pass can notice.
func TestLateHealthPassAsksTheProviderFirst(t *testing.T) {
	ca, err := pki.GenerateWorkloadCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	rp := &reporter{silent: map[string]bool{}, notices: map[string]*nstancev1.TerminationNotice{}}
	cfg, err := config.Parse([]byte(shardtest.Config("c1", "s1", "mock")))
	require.NoError(t, err)
	store := memstore.New()
	p := mock.New()
	const interval = 100 * time.Millisecond
	f, err := app.Assemble(app.Parts{Store: store, Keys: layout.New(""), Config: cfg, ConfigETag: "e1", ConfigModified: time.Now(),
		Provider: p, WorkloadCA: ca, Tuning: app.Tuning{ResyncInterval: time.Hour, RetryBase: 20 * time.Millisecond, Now: now,
			MonitorMock: true, HealthInterval: interval, HealthMisses: 3, StartupGrace: time.Hour}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Lead(ctx) }()
	go rp.run(ctx, f)
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, f.Reconciler.Running, 5*time.Second, time.Millisecond)
	errs := f.Events.Errors.Subscribe("t")
	t.Cleanup(errs.Close)
	e := env{f: f, p: p, store: store}
	upsert(t, e, "web", 1, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		return int(f.Reconciler.GroupStatus(mustGroup(t, f, "web")).GetReadyCount()) == 1
	}, 5*time.Second, 10*time.Millisecond)
	victim := running(e, "web")[0].ID

	rp.mu.Lock()
	rp.silent[victim] = true
	rp.mu.Unlock()
	p.Stop(victim)
	offset.Store(int64(10 * interval))

	var ev *nstancev1.ErrorEvent
	select {
	case ev = <-errs.Events():
	case <-time.After(10 * time.Second):
		t.Fatal("no error event for the stopped instance")
	}
	offset.Store(0)
	require.Equal(t, victim, ev.GetInstanceId())
	require.Contains(t, ev.GetMessage(), "instance stopped", "the provider's answer wins over the missed-report count")
	rec, ok := f.Instances.Get(victim)
	if ok {
		require.True(t, rec.WorkloadGone, "a stopped workload is recorded as gone (the operator skips its drain)")
	}
}
