package manager_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
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
	r := startOperator(b, f.options(b))
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
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
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
	const groups = 1000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f := newFixture(b, "shard-a", "shard-b")
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

		start := time.Now()
		r := startOperator(b, f.options(b))
		r.waitImported(b)
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
		r.stop()
	}
}
