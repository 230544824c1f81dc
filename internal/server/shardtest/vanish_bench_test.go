package shardtest_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// creates records when each instance's create reached the provider.
type creates struct {
	*process.Provider
	mu sync.Mutex
	at map[string]time.Time
}

func (c *creates) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	c.mu.Lock()
	c.at[req.InstanceID] = time.Now()
	c.mu.Unlock()
	return c.Provider.Create(ctx, req)
}

// since returns the create times after t, sorted.
func (c *creates) since(t time.Time) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, at := range c.at {
		if at.After(t) {
			out = append(out, at)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

func benchEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// quantile of sorted ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return quantile(s, 0.5)
}

// stages watches victims until stop is called: when the server stamped
// each one's last stream closed or its shutdown report (the live table's
// own times) and when its record was first seen out of Running (polled
// every 5 ms). It says where a replacement's delay goes: noticing the VM
// gone, deciding, or creating.
type stages struct {
	mu                     sync.Mutex
	gone, reported, marked map[string]time.Time
	stop                   chan struct{}
	done                   chan struct{}
}

func watchStages(a *agentShard, ids []string) *stages {
	st := &stages{gone: map[string]time.Time{}, reported: map[string]time.Time{}, marked: map[string]time.Time{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-st.stop:
				return
			case <-tk.C:
			}
			term := a.sh.Assembly.Term()
			st.mu.Lock()
			for _, id := range ids {
				if _, ok := st.marked[id]; ok && (!st.gone[id].IsZero() || !st.reported[id].IsZero()) {
					continue // seen through
				}
				if term != nil {
					if p, ok := term.Agents.Presence(id); ok {
						if !p.DisconnectedAt.IsZero() && p.Streams == 0 {
							st.gone[id] = p.DisconnectedAt
						}
						if !p.ShutdownAt.IsZero() {
							st.reported[id] = p.ShutdownAt
						}
					}
				}
				if _, ok := st.marked[id]; !ok {
					if r, ok := a.sh.Assembly.Instances.Get(id); !ok || r.State != instances.StateRunning {
						st.marked[id] = time.Now()
					}
				}
			}
			st.mu.Unlock()
		}
	}()
	return st
}

// end stops the watch and returns the sorted delays after t0 of each stage.
func (st *stages) end(t0 time.Time) (gone, reported, marked []time.Duration) {
	close(st.stop)
	<-st.done
	since := func(m map[string]time.Time) []time.Duration {
		out := make([]time.Duration, 0, len(m))
		for _, at := range m {
			out = append(out, at.Sub(t0))
		}
		slices.Sort(out)
		return out
	}
	return since(st.gone), since(st.reported), since(st.marked)
}

func p50p99(ds []time.Duration) string {
	return quantile(ds, 0.5).Round(time.Millisecond).String() + " / " + quantile(ds, 0.99).Round(time.Millisecond).String()
}

// BenchmarkVMsGoing: NSTANCE_BENCH_VMS (default 300) real agents, each in
// a VM shell under the process provider, connected to one shard with a
// 90 s health rule; three rounds each of NSTANCE_BENCH_VICTIMS (default
// 100) VMs killed at once, agents reporting their host's shutdown and then
// stopping with their VM, and agents restarted on living VMs. It reports
// medians over the rounds of: kill → replacement create p99 and max, kill →
// every replacement registered; SIGTERM → replacement create p99 (the
// agent's last report comes a few ms after the signal); replacements after
// the restarts (must be 0).
//
//	NSTANCE_BENCH_VMS=300 go test -run '^$' -bench BenchmarkVMsGoing -benchtime 1x ./internal/server/shardtest/
func BenchmarkVMsGoing(b *testing.B) {
	vms, victims := benchEnvInt("NSTANCE_BENCH_VMS", 300), benchEnvInt("NSTANCE_BENCH_VICTIMS", 100)
	nice := 10
	if v, err := strconv.Atoi(os.Getenv("NSTANCE_BENCH_NICE")); err == nil && v >= 0 {
		nice = v
	}
	b.Logf("VMs at nice +%d", nice)
	const rounds = 3
	cfg := strings.Replace(agentConfig("worker"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "1s", "health_check_interval": "30s", "health_misses": 3, "agent_startup_grace": "5m", "shutdown_grace": "60s",
		"limits": { "registration_rate": { "per_minute": 1000000, "burst": 10000 }, "max_connections_per_source": 1000000,
		  "tenant_create_rate": { "per_minute": 1000000, "burst": 10000 } },`, 1)
	rec := &creates{at: map[string]time.Time{}}
	a := startAgentShardProc(b, cfg, func(c *process.Config) {
		c.Command = append([]string{"/bin/sh", "-c", vmShell}, c.Command...)
		c.Env = append(c.Env, "NSTANCE_SHUTDOWN_DETECT=always", "NSTANCE_METRICS_INTERVAL=10s", "NSTANCE_LOG_LEVEL=error")
		// The VMs run below the server's priority, as on separate hosts
		// they would not take its CPU (NSTANCE_BENCH_NICE=0: same priority).
		c.Nice = nice
	}, func(o *shardtest.Options) {
		rec.Provider = o.Provider.(*process.Provider)
		o.Provider = rec
	})
	ctx := context.Background()
	if _, err := a.c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "workers", Template: "worker", Size: uint32(vms)}}); err != nil {
		b.Fatal(err)
	}
	// wait polls cond every 10 ms up to limit (the creates themselves are
	// timed by the provider wrapper, not by the polling).
	wait := func(limit time.Duration, what string, cond func() bool) {
		b.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatalf("%s: not within %s", what, limit)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	reported := func(id string) bool {
		term := a.sh.Assembly.Term()
		if term == nil {
			return false
		}
		r, ok := term.Agents.Get(id)
		return ok && r.Reports > 0
	}
	// steady: vms running members, every one reported, none on its way out.
	steady := func() []string {
		var ids []string
		for _, r := range a.sh.Assembly.Instances.ListGroup("acme", "workers") {
			if r.State != instances.StateRunning || !reported(r.ID) {
				return nil
			}
			ids = append(ids, r.ID)
		}
		if len(ids) != vms {
			return nil
		}
		slices.Sort(ids)
		return ids
	}
	startAll := time.Now()
	var members []string
	wait(15*time.Minute, "every VM running and reporting", func() bool { members = steady(); return members != nil })
	b.Logf("%d VMs running and reporting after %s", vms, time.Since(startAll).Round(time.Millisecond))
	shellPID := func(id string) int {
		pid, ok := a.p.PID(id)
		if !ok {
			b.Fatalf("no VM shell for %s", id)
		}
		return pid
	}
	agentPID := func(id string) int {
		var pid int
		wait(30*time.Second, "agent of "+id, func() bool { pid = childOf(b, shellPID(id)); return pid != 0 })
		return pid
	}

	var killP99, killMax, killReg, downP99, downMax, reportP99 []time.Duration
	var restartCreates []int
	b.ResetTimer()
	for round := range rounds {
		// Killed outright.
		vs := members[:victims]
		shells := make([]int, len(vs))
		for i, id := range vs {
			shells[i] = shellPID(id)
		}
		watch := watchStages(a, vs)
		t0 := time.Now()
		for _, pid := range shells {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		var made []time.Time
		wait(2*time.Minute, "replacements of the killed VMs created", func() bool { made = rec.since(t0); return len(made) >= victims })
		gone, _, marked := watch.end(t0)
		b.Logf("round %d: kill stages p50 / p99: last stream closed %s, record out of Running %s (%d/%d seen)", round,
			p50p99(gone), p50p99(marked), len(gone), len(marked))
		ds := make([]time.Duration, 0, victims)
		for _, at := range made[:victims] {
			ds = append(ds, at.Sub(t0))
		}
		wait(5*time.Minute, "the killed VMs' replacements registered and the group steady", func() bool { members = steady(); return members != nil })
		var regAt time.Time
		for _, r := range a.sh.Assembly.Instances.ListGroup("acme", "workers") {
			if first, ok := a.firstReport(r.ID); ok && r.CreatedAt.After(t0) && first.After(regAt) {
				regAt = first
			}
		}
		killP99, killMax, killReg = append(killP99, quantile(ds, 0.99)), append(killMax, ds[len(ds)-1]), append(killReg, regAt.Sub(t0))
		b.Logf("round %d: %d VMs killed: replacement creates p50 %s p99 %s max %s; all registered after %s", round, victims,
			quantile(ds, 0.5).Round(time.Millisecond), quantile(ds, 0.99).Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), regAt.Sub(t0).Round(time.Millisecond))

		// Host shutdown reported, then the VM stops with its agent.
		vs = members[:victims]
		agents := make([]int, len(vs))
		for i, id := range vs {
			agents[i] = agentPID(id)
			if err := os.WriteFile(localagent.IdentityDir(a.stateDir, id)+".halt", nil, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		sent := make([]time.Time, len(vs))
		watch = watchStages(a, vs)
		t0 = time.Now()
		for i, pid := range agents {
			sent[i] = time.Now()
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		wait(2*time.Minute, "replacements of the shut-down VMs created", func() bool { made = rec.since(t0); return len(made) >= victims })
		_, reported, marked := watch.end(t0)
		// The k-th replacement create against the k-th shutdown report the
		// server received (both in order): the server's part alone.
		afterReport := make([]time.Duration, 0, victims)
		for i := range min(len(reported), victims) {
			afterReport = append(afterReport, made[i].Sub(t0)-reported[i])
		}
		slices.Sort(afterReport)
		reportP99 = append(reportP99, quantile(afterReport, 0.99))
		b.Logf("round %d: shutdown stages p50 / p99: report received %s, record out of Running %s; create after its report %s (%d reports)", round,
			p50p99(reported), p50p99(marked), p50p99(afterReport), len(reported))
		ds = ds[:0]
		for i, at := range made[:victims] {
			ds = append(ds, at.Sub(sent[i])) // the i-th create against the i-th signal
		}
		slices.Sort(ds)
		downP99, downMax = append(downP99, quantile(ds, 0.99)), append(downMax, ds[len(ds)-1])
		b.Logf("round %d: %d hosts shut down: replacement creates after the signal p50 %s p99 %s max %s", round, victims,
			quantile(ds, 0.5).Round(time.Millisecond), quantile(ds, 0.99).Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
		wait(5*time.Minute, "the shut-down VMs' replacements registered and the group steady", func() bool { members = steady(); return members != nil })

		// Agents restarted on living VMs.
		vs = members[:victims]
		old := map[string]int{}
		for _, id := range vs {
			old[id] = agentPID(id)
		}
		t0 = time.Now()
		for _, pid := range old {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		wait(5*time.Minute, "the restarted agents back", func() bool {
			term := a.sh.Assembly.Term()
			for _, id := range vs {
				p, ok := term.Agents.Presence(id)
				r, _ := term.Agents.Get(id)
				if !ok || p.Streams == 0 || !p.ShutdownAt.IsZero() || !r.Received.After(t0) {
					return false
				}
			}
			return true
		})
		n := len(rec.since(t0))
		restartCreates = append(restartCreates, n)
		b.Logf("round %d: %d agents restarted on living VMs: %d replacements", round, victims, n)
		members = steady()
		if members == nil {
			b.Fatalf("round %d: the group is not steady after the restarts", round)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(median(killP99).Milliseconds()), "kill-create-p99-ms")
	b.ReportMetric(float64(median(killMax).Milliseconds()), "kill-create-max-ms")
	b.ReportMetric(float64(median(killReg).Milliseconds()), "kill-registered-ms")
	b.ReportMetric(float64(median(downP99).Milliseconds()), "shutdown-create-p99-ms")
	b.ReportMetric(float64(median(downMax).Milliseconds()), "shutdown-create-max-ms")
	b.ReportMetric(float64(median(reportP99).Milliseconds()), "report-create-p99-ms")
	b.ReportMetric(float64(slices.Max(restartCreates)), "restart-replacements")
}
