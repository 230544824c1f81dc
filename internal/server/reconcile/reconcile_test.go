package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/config"
	"github.com/nstance-dev/nstance/internal/server/fleet"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/layout"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

type env struct {
	f     *fleet.Fleet
	p     *mock.Provider
	store objstore.Store
}

// start runs a fleet over cfgEdit(test config); prepare runs before Run.
func start(t *testing.T, cfgEdit func(string) string, prepare func(*fleet.Fleet)) env {
	t.Helper()
	text := shardtest.Config("c1", "s1", "mock")
	if cfgEdit != nil {
		text = cfgEdit(text)
	}
	cfg, err := config.Parse([]byte(text))
	require.NoError(t, err)
	store := memstore.New()
	p := mock.New()
	f, err := fleet.New(fleet.Options{Store: store, Keys: layout.New(""), Config: liveconfig.New(store, "config/s1.jsonc", cfg, "e1", time.Now()),
		Provider: p, ResyncInterval: 100 * time.Millisecond, RetryBase: 20 * time.Millisecond})
	require.NoError(t, err)
	if prepare != nil {
		prepare(f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
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
	time.Sleep(150 * time.Millisecond)
	require.LessOrEqual(t, e.f.Instances.Len(), 2, "burst of 2, then 2 per second")
	require.Eventually(t, func() bool { return len(running(e, "web")) == 5 }, 10*time.Second, 10*time.Millisecond)
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
	e := start(t, nil, func(f *fleet.Fleet) {
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
