package metrics

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the operator's collectors. A nil *Metrics records nothing,
// so packages can be used without metrics in tests.
type Metrics struct {
	syncLatency      *prometheus.HistogramVec
	streamReconnects *prometheus.CounterVec
	shardUp          *prometheus.GaugeVec
	imported         prometheus.Counter
}

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		syncLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "nstance", Subsystem: "operator", Name: "group_sync_duration_seconds",
			Help:    "Duration of group sync calls (UpsertGroup, DeleteGroup) to a shard, by result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"shard", "op", "result"}),
		streamReconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nstance", Subsystem: "operator", Name: "stream_reconnects_total",
			Help: "Watch streams (re)opened to a shard after the first, by stream.",
		}, []string{"shard", "stream"}),
		shardUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "nstance", Subsystem: "operator", Name: "shard_up",
			Help: "1 when the operator's gRPC connection to the shard is ready, else 0.",
		}, []string{"shard"}),
		imported: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nstance", Subsystem: "operator", Name: "imported_groups_total",
			Help: "Server groups imported into Kubernetes as NstanceMachinePool + MachinePool.",
		}),
	}
	for _, c := range []prometheus.Collector{m.syncLatency, m.streamReconnects, m.shardUp, m.imported} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register operator metrics: %w", err)
		}
	}
	return m, nil
}

// ObserveSync records one sync call.
func (m *Metrics) ObserveSync(shard, op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.syncLatency.WithLabelValues(shard, op, result).Observe(d.Seconds())
}

// StreamReconnected counts a watch stream reopened after a failure.
func (m *Metrics) StreamReconnected(shard, stream string) {
	if m == nil {
		return
	}
	m.streamReconnects.WithLabelValues(shard, stream).Inc()
}

// SetShardUp records the health of a shard.
func (m *Metrics) SetShardUp(shard string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.shardUp.WithLabelValues(shard).Set(v)
}

// Imported counts imported groups.
func (m *Metrics) Imported(n int) {
	if m == nil {
		return
	}
	m.imported.Add(float64(n))
}
