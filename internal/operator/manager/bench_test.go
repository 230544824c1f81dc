package manager_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// percentile returns the p-th percentile (0..100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// BenchmarkReplicaEditToServer measures a MachinePool replica edit until the
// server of shard-a reports the new size on its WatchGroups stream (Kubernetes
// watch -> pool controller -> shard group -> UpsertGroup -> server event).
// Run with -benchtime=200x for the 200-edit figure.
func BenchmarkReplicaEditToServer(b *testing.B) {
	f := newFixture(b, "shard-a", "shard-b")
	f.putNonce(b)
	calls := &apiCalls{}
	o := f.options(b)
	o.RestConfig = calls.wrap(o.RestConfig)
	r := startOperator(b, o)
	r.waitImported(b)
	f.createPool(b, "bench", 2, "shard-a", "shard-b")
	require.Eventually(b, func() bool { return slices.Equal(f.serverSizes(b, "bench", "shard-a"), [][2]int{{1, 1}}) }, waitLong, tick)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := f.shards["shard-a"].client(b).WatchGroups(ctx, &nstancev1.WatchGroupsRequest{GroupIds: []string{"bench"}})
	require.NoError(b, err)
	sizes := make(chan uint32, 1024)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				close(sizes)
				return
			}
			if ev.GetGroup() != nil {
				sizes <- ev.GetGroup().GetSpec().GetSize()
			}
		}
	}()
	var mp clusterv1.MachinePool
	require.NoError(b, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "bench"}, &mp))

	lat := make([]time.Duration, 0, b.N)
	writesBefore := calls.total()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Alternate 4 and 2 replicas: shard-a's share goes 2, 1, 2, ...
		replicas, want := int32(4), uint32(2)
		if i%2 == 1 {
			replicas, want = 2, 1
		}
		mp.Spec.Replicas = &replicas
		start := time.Now()
		require.NoError(b, env.Client.Update(ctx, &mp))
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case s, ok := <-sizes:
				require.True(b, ok, "watch stream ended")
				if s == want {
					break wait
				}
			case <-timeout:
				b.Fatalf("edit %d: server never reported size %d", i, want)
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	// The operator's requests per edit (reads that missed the cache
	// included); some may land after the last edit was measured.
	b.ReportMetric(float64(calls.total()-writesBefore)/float64(b.N), "api-calls/edit")
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}

// apiCalls counts the operator's requests to the API server by verb and
// resource ("PATCH nstanceshardgroups/status"), watches left out.
type apiCalls struct {
	mu sync.Mutex
	n  map[string]int
}

// wrap returns a copy of cfg whose requests are counted.
func (c *apiCalls) wrap(cfg *rest.Config) *rest.Config {
	c.n = map[string]int{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Query().Get("watch") != "true" {
				c.mu.Lock()
				c.n[req.Method+" "+apiResource(req.URL.Path)]++
				c.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// writes returns the number of writes (every verb but GET) to resource
// ("nstanceshardgroups", "nstanceshardgroups/status").
func (c *apiCalls) writes(resource string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.n {
		verb, res, _ := strings.Cut(k, " ")
		if verb != http.MethodGet && res == resource {
			n += v
		}
	}
	return n
}

// total returns the number of requests counted.
func (c *apiCalls) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

// apiResource turns ".../namespaces/ns/nstanceshardgroups/name/status" into
// "nstanceshardgroups/status".
func apiResource(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			rest := parts[i+2:]
			if len(rest) >= 3 {
				return rest[0] + "/" + rest[2]
			}
			return rest[0]
		}
	}
	if len(parts) > 0 {
		return parts[len(parts)-1]
	}
	return path
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// reconcileErrors sums controller-runtime's reconcile error counter over
// every controller of this process.
func reconcileErrors(b *testing.B) float64 {
	mfs, err := ctrlmetrics.Registry.Gather()
	require.NoError(b, err)
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// rssKiB reads this process's resident set size.
func rssKiB() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			fields := strings.Fields(line)
			if len(fields) >= 2 {
				n, _ := strconv.ParseInt(fields[1], 10, 64)
				return n
			}
		}
	}
	return -1
}

// BenchmarkStartupImport measures importing 1,000 groups present on each of
// two shards: the time until the import finished (pools and MachinePools
// created) and until every pool is Ready (2,000 shard groups synced), and
// the process RSS / Go heap growth. The process also hosts both fake shards;
// the API server runs separately.
func BenchmarkStartupImport(b *testing.B) {
	groups := 1000
	if v := os.Getenv("NSTANCE_BENCH_GROUPS"); v != "" { // a quicker look: fewer groups
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		groups = n
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// The default quota (256 groups per tenant) is raised for 1,000.
		f := newFixtureConfig(b, func(id string) string {
			return strings.Replace(shardtest.Config(clusterID, id, "mock"), `"default_drain_timeout"`,
				`"limits": { "max_groups_per_tenant": 2000 }, "default_drain_timeout"`, 1)
		}, "shard-a", "shard-b")
		f.putNonce(b)
		ctx := context.Background()
		for _, s := range []string{"shard-a", "shard-b"} {
			c := f.shards[s].client(b)
			for g := 0; g < groups; g++ {
				_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
					GroupId: fmt.Sprintf("g%04d", g), Template: "worker", Size: 0,
				}})
				require.NoError(b, err)
			}
		}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		rssBefore := rssKiB()
		b.StartTimer()

		calls := &apiCalls{}
		o := f.options(b)
		o.RestConfig = calls.wrap(o.RestConfig)
		errsBefore := reconcileErrors(b)
		start := time.Now()
		r := startOperator(b, o)
		r.waitImportedWithin(b, 10*time.Minute)
		imported := time.Since(start)
		require.Len(b, r.op.ImportResult.Imported, groups)
		require.Eventually(b, func() bool {
			var list infrav1.NstanceMachinePoolList
			if err := env.Client.List(ctx, &list, client.InNamespace(f.ns)); err != nil {
				return false
			}
			ready := 0
			for _, p := range list.Items {
				if meta.IsStatusConditionTrue(p.Status.Conditions, infrav1.ReadyCondition) {
					ready++
				}
			}
			return ready == groups
		}, 10*time.Minute, 500*time.Millisecond)
		converged := time.Since(start)

		b.StopTimer()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(imported.Seconds(), "import-s")
		b.ReportMetric(converged.Seconds(), "all-ready-s")
		b.ReportMetric(float64(rssKiB()-rssBefore)/1024, "rss-growth-MiB")
		b.ReportMetric(float64(rssKiB())/1024, "rss-MiB")
		b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-growth-MiB")
		// API writes per imported group, by kind (the import's own two
		// creates included), and reconciles that failed (each one retried
		// through the rate limiter).
		for _, res := range []string{"nstancemachinepools", "nstancemachinepools/status", "machinepools", "nstanceshardgroups", "nstanceshardgroups/status"} {
			b.ReportMetric(float64(calls.writes(res))/float64(groups), strings.ReplaceAll(res, "/", "-")+"-writes/group")
		}
		b.ReportMetric(reconcileErrors(b)-errsBefore, "reconcile-errors")
		r.stop()
	}
}
