package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// cpuSeconds is the CPU time (user + system) the process used so far: less
// sensitive than wall time to other work on a shared machine.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkConverge1000Groups measures how long a mock-provider shard takes
// to converge 1,000 groups of 10 instances from empty (records written to
// in-memory object storage, an Ed25519 agent nonce minted per instance).
func BenchmarkConverge1000Groups(b *testing.B) {
	const groupsN, size = 1000, 10
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		store := memstore.New()
		cfg := benchConfig(b)
		f, err := app.Assemble(app.Parts{Config: cfg, ConfigETag: "e1", Store: store, Keys: layout.New(""), Provider: mock.New(),
			NonceKey: benchNonceKey(b), Tuning: app.Tuning{ResyncInterval: time.Hour}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		runtime.GC()
		b.StartTimer()
		start, cpu0 := time.Now(), cpuSeconds()
		go func() { done <- f.Lead(ctx) }()
		for !f.Reconciler.Running() {
			time.Sleep(time.Millisecond)
		}
		for g := 0; g < groupsN; g++ {
			if _, _, err := f.Ops.UpsertGroup(ctx, "bench", &nstancev1.GroupSpec{GroupId: fmt.Sprintf("g%04d", g), Template: "worker", Size: size}, ""); err != nil {
				b.Fatal(err)
			}
		}
		upserted := time.Since(start)
		for {
			if f.Instances.Len() == groupsN*size &&
				len(f.Instances.List(func(r *instances.Record) bool { return r.State != instances.StateRunning })) == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed, cpu := time.Since(start), cpuSeconds()-cpu0
		b.StopTimer()
		b.ReportMetric(elapsed.Seconds(), "s/converge")
		b.ReportMetric(cpu, "cpu-s/converge")
		b.ReportMetric(upserted.Seconds(), "s/upserts")
		b.ReportMetric(float64(groupsN*size)/elapsed.Seconds(), "instances/s")
		b.ReportMetric(rssMiB(), "MiB-RSS")
		cancel()
		<-done
		b.StartTimer()
	}
}

// BenchmarkConvergeStoredGroups starts a fresh server whose storage already
// holds 1,000 dynamic groups of 10 (and no instances): pure reconcile time.
func BenchmarkConvergeStoredGroups(b *testing.B) {
	const groupsN, size = 1000, 10
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		store := memstore.New()
		cfg := benchConfig(b)
		f, err := app.Assemble(app.Parts{Config: cfg, ConfigETag: "e1", Store: store, Keys: layout.New(""), Provider: mock.New(),
			NonceKey: benchNonceKey(b), Tuning: app.Tuning{ResyncInterval: time.Hour}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := f.Groups.Load(ctx); err != nil {
			b.Fatal(err)
		}
		for g := 0; g < groupsN; g++ {
			if _, _, err := f.Groups.Upsert(ctx, groups.Key{Tenant: "bench", ID: fmt.Sprintf("g%04d", g)}, groups.Spec{Template: "worker", Size: size}, ""); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		done := make(chan error, 1)
		b.StartTimer()
		start, cpu0 := time.Now(), cpuSeconds()
		go func() { done <- f.Lead(ctx) }()
		for {
			if f.Instances.Len() == groupsN*size &&
				len(f.Instances.List(func(r *instances.Record) bool { return r.State != instances.StateRunning })) == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed, cpu := time.Since(start), cpuSeconds()-cpu0
		b.StopTimer()
		b.ReportMetric(elapsed.Seconds(), "s/converge")
		b.ReportMetric(cpu, "cpu-s/converge")
		b.ReportMetric(float64(groupsN*size)/elapsed.Seconds(), "instances/s")
		b.ReportMetric(rssMiB(), "MiB-RSS")
		cancel()
		<-done
		b.StartTimer()
	}
}

func benchNonceKey(b *testing.B) ed25519.PrivateKey {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	return key
}

// benchConfig is the test shard config with the tenant limits raised above
// what 1,000 groups of 10 need (the defaults allow 256 groups and pace
// creates at 300 a minute, which would make the benchmark measure the limit).
func benchConfig(b *testing.B) *config.Config {
	cfg, err := config.Parse([]byte(shardtest.Config("bench", "bench-1", "mock")))
	if err != nil {
		b.Fatal(err)
	}
	l := &cfg.Shard.Limits
	l.MaxGroupsPerTenant = 2000
	l.TenantCreateRate = config.RateLimit{PerMinute: 1 << 20, Burst: 1 << 20}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	return cfg
}
