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
	drainDuration    *prometheus.HistogramVec
	evictions        *prometheus.CounterVec
	reg              prometheus.Registerer
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
	m.drainDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "nstance", Subsystem: "operator", Name: "drain_duration_seconds",
		Help:    "Time from a drain's announcement to its acknowledgement, by shard and outcome (drained, skipped).",
		Buckets: []float64{.1, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
	}, []string{"shard", "outcome"})
	m.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nstance", Subsystem: "operator", Name: "evictions_total",
		Help: "Pod evictions posted while draining, by outcome (evicted, gone, blocked by a PodDisruptionBudget, error).",
	}, []string{"outcome"})
	for _, o := range []string{EvictionEvicted, EvictionGone, EvictionBlocked, EvictionError} {
		m.evictions.WithLabelValues(o)
	}
	m.reg = reg
	for _, c := range []prometheus.Collector{m.syncLatency, m.streamReconnects, m.shardUp, m.imported, m.drainDuration, m.evictions} {
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

// Eviction outcomes.
const (
	EvictionEvicted = "evicted"
	EvictionGone    = "gone"
	EvictionBlocked = "blocked"
	EvictionError   = "error"
)

// Evicted counts one eviction request by outcome.
func (m *Metrics) Evicted(outcome string) {
	if m == nil {
		return
	}
	m.evictions.WithLabelValues(outcome).Inc()
}

// DrainDone records a drain acknowledged d after it was announced;
// skipped drains evicted nothing (the workload was gone or excluded).
func (m *Metrics) DrainDone(shard string, skipped bool, d time.Duration) {
	if m == nil {
		return
	}
	outcome := "drained"
	if skipped {
		outcome = "skipped"
	}
	m.drainDuration.WithLabelValues(shard, outcome).Observe(d.Seconds())
}

// WatchDrains exports pending() as nstance_operator_drains_pending, read
// at scrape time.
func (m *Metrics) WatchDrains(pending func() int) error {
	if m == nil {
		return nil
	}
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "nstance", Subsystem: "operator", Name: "drains_pending",
		Help: "Drains the operator tracks: announced and not yet finished (the instance not yet deleted).",
	}, func() float64 { return float64(pending()) })
	if err := m.reg.Register(g); err != nil {
		return fmt.Errorf("register operator drain metrics: %w", err)
	}
	return nil
}
