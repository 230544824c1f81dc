package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// rotationResult is what one rolling rotation measured.
type rotationResult struct {
	elapsed, cpu time.Duration
	checks       int64
	// short is the first moment a group had fewer running members than its
	// size ("" when never).
	short string
}

// rollingRotation converges groupsN groups of size instances (mock
// provider, no create rate limit), then changes every group's instance type
// at once and waits until every member runs with the new type (rotation
// surge 1 per group, drain timeout 1ms). While it rotates, a watcher visits
// the records every millisecond (Store.Each, no copies) and checks that
// every group always has at least size members in state running.
func rollingRotation(tb testing.TB, groupsN, size int, limit time.Duration) rotationResult {
	tb.Helper()
	cfg, err := config.Parse([]byte(shardtest.Config("bench", "bench-1", "mock")))
	if err != nil {
		tb.Fatal(err)
	}
	l := &cfg.Shard.Limits
	l.MaxGroupsPerTenant = groupsN + 10
	l.TenantCreateRate = config.RateLimit{PerMinute: 1 << 20, Burst: 1 << 20}
	cfg.Shard.RotationSurge = 1
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	wca, err := pki.GenerateWorkloadCA("bench", time.Hour, time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	// Health is monitored (a member is ready once its agent reported), as
	// with a real provider; the bench stands in for the agents below.
	f, err := app.Assemble(app.Parts{Config: cfg, ConfigETag: "e1", Store: memstore.New(), Keys: layout.New(""), Provider: mock.New(),
		NonceKey: benchNonceKeyTB(tb), WorkloadCA: wca, Tuning: app.Tuning{ResyncInterval: time.Hour, MonitorMock: true}})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Lead(ctx) }()
	var agents sync.WaitGroup
	defer func() { cancel(); agents.Wait(); <-done }()
	// Agents: every running instance reports as soon as it runs, then every
	// second (the config's health interval is 30s).
	agents.Add(1)
	go func() {
		defer agents.Done()
		last := map[string]time.Time{}
		var due []agentapi.Ref
		for ctx.Err() == nil {
			now := time.Now()
			// Each, not List: copying 10,000 records every pass took the
			// cores from the reconciler the bench measures.
			due = due[:0]
			f.Instances.Each(func(r *instances.Record) {
				if r.State == instances.StateRunning && now.Sub(last[r.ID]) >= time.Second {
					last[r.ID] = now
					due = append(due, agentapi.Ref{InstanceID: r.ID, Tenant: r.Tenant, Shard: r.Shard, Group: r.GroupID})
				}
			})
			if term := f.Term(); term != nil {
				for _, ref := range due {
					_ = term.Agents.RecordHealth(ctx, ref, &nstancev1.HealthReport{AgentVersion: "bench"}, now)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	for !f.Reconciler.Running() {
		time.Sleep(time.Millisecond)
	}
	upsert := func(instanceType string) {
		for g := range groupsN {
			spec := &nstancev1.GroupSpec{GroupId: fmt.Sprintf("g%04d", g), Template: "worker", Size: uint32(size),
				InstanceType: instanceType, DrainTimeout: durationpb.New(time.Millisecond)}
			if _, _, err := f.Ops.UpsertGroup(ctx, "bench", spec, ""); err != nil {
				tb.Fatal(err)
			}
		}
	}
	// converged: every group has exactly size members, all running with want.
	converged := func(want string) bool {
		n, other := 0, 0
		f.Instances.Each(func(r *instances.Record) {
			if r.State == instances.StateRunning && r.InstanceType == want {
				n++
			} else {
				other++
			}
		})
		return other == 0 && n == groupsN*size
	}
	waitFor := func(want string, limit time.Duration) {
		deadline := time.Now().Add(limit)
		for !converged(want) {
			if time.Now().After(deadline) {
				seen := map[string]int{}
				for _, r := range f.Instances.List(func(*instances.Record) bool { return true }) {
					seen[string(r.State)+"/"+r.InstanceType]++
				}
				tb.Fatalf("not converged to %s within %s: %v", want, limit, seen)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	upsert("test.small")
	waitFor("test.small", limit)
	runtime.GC()

	var res rotationResult
	var checks atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		running := map[string]int{}
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Continuous, with a millisecond's pause so the check does not
			// take a core away from the reconciler it watches.
			time.Sleep(time.Millisecond)
			clear(running)
			f.Instances.Each(func(r *instances.Record) {
				if r.State == instances.StateRunning {
					running[r.GroupID]++
				}
			})
			checks.Add(1)
			for g := range groupsN {
				id := fmt.Sprintf("g%04d", g)
				if running[id] < size {
					mu.Lock()
					if res.short == "" {
						res.short = fmt.Sprintf("group %s had %d running members, size %d", id, running[id], size)
					}
					mu.Unlock()
				}
			}
		}
	}()
	start, cpu0 := time.Now(), cpuSeconds()
	upsert("test.large")
	waitFor("test.large", limit)
	res.elapsed, res.cpu = time.Since(start), time.Duration((cpuSeconds()-cpu0)*float64(time.Second))
	close(stop)
	wg.Wait()
	res.checks = checks.Load()
	return res
}

func benchNonceKeyTB(tb testing.TB) ed25519.PrivateKey {
	tb.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

// TestRollingRotationKeepsGroupSize is the small version of
// BenchmarkRollingRotation10000: 20 groups of 5 rotate; no group ever has
// fewer running members than its size.
func TestRollingRotationKeepsGroupSize(t *testing.T) {
	res := rollingRotation(t, 20, 5, time.Minute)
	if res.short != "" {
		t.Fatal(res.short)
	}
	if res.checks < 2 {
		t.Fatalf("only %d checks while rotating", res.checks)
	}
}

// BenchmarkRollingRotation10000: 1,000 groups of 10
// (NSTANCE_BENCH_ROTATION_GROUPS groups of 10 when set) converge, then every
// group's instance type changes and all 10,000 instances rotate with surge 1
// per group; never fewer running members than the group size (checked
// continuously).
func BenchmarkRollingRotation10000(b *testing.B) {
	groupsN := 1000
	if v, err := strconv.Atoi(os.Getenv("NSTANCE_BENCH_ROTATION_GROUPS")); err == nil && v > 0 {
		groupsN = v // a smaller fleet on a busy machine
	}
	for range b.N {
		res := rollingRotation(b, groupsN, 10, 20*time.Minute)
		if res.short != "" {
			b.Fatal(res.short)
		}
		b.ReportMetric(res.elapsed.Seconds(), "s/rotation")
		b.ReportMetric(res.cpu.Seconds(), "cpu-s/rotation")
		b.ReportMetric(float64(res.checks), "checks")
		b.ReportMetric(rssMiB(), "MiB-RSS")
	}
}
