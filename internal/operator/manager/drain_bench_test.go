package manager_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkDrainTenPods measures pending-deletion → AcknowledgeDrained for
// a Node with 10 evictable pods: DeleteInstance on the shard starts the
// clock, the operator's acknowledgement stops it.
func BenchmarkDrainTenPods(b *testing.B) {
	f := newFixture(b, "shard-a")
	f.putNonce(b)
	acked := make(chan string, 16)
	o := f.options(b)
	o.DrainRetryInterval = 100 * time.Millisecond
	o.OnDrainAcknowledged = func(_, id string, _ bool) { acked <- id }
	r := startOperator(b, o)
	r.waitImported(b)
	sh := f.shards["shard-a"]

	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		inst := onDemand(b, sh, time.Minute)
		node := "node-" + inst.GetInstanceId()
		createNode(b, env.Client, node, inst.GetProviderId())
		for j := range 10 {
			createPod(b, env.Client, f.ns, fmt.Sprintf("b%d-%d", i, j), node, plainPod, nil)
		}
		b.StartTimer()
		start := time.Now()
		deleteInstance(b, sh, inst.GetInstanceId())
		select {
		case id := <-acked:
			require.Equal(b, inst.GetInstanceId(), id)
		case <-time.After(30 * time.Second):
			b.Fatalf("drain %d not acknowledged", i)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}
