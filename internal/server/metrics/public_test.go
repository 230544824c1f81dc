package metrics_test

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/metrics"
)

// TestPublicAggregatesTenantSeries: the public view drops tenant and group
// labels, sums counters and gauges (the oldest-age gauges take their
// maximum), and passes series without tenant labels through unchanged.
func TestPublicAggregatesTenantSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	inst := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nstance_server_instances", Help: "i"}, []string{"tenant", "group", "state"})
	inst.WithLabelValues("acme", "web", "running").Set(3)
	inst.WithLabelValues("acme", "db", "running").Set(2)
	inst.WithLabelValues("globex", "", "running").Set(1)
	inst.WithLabelValues("globex", "api", "pending").Set(4)
	age := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nstance_server_drain_oldest_age_seconds", Help: "a"}, []string{"tenant", "group"})
	age.WithLabelValues("acme", "web").Set(30)
	age.WithLabelValues("globex", "api").Set(90)
	created := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nstance_test_created_total", Help: "c"}, []string{"tenant"})
	created.WithLabelValues("acme").Add(5)
	created.WithLabelValues("globex").Add(7)
	ready := prometheus.NewGauge(prometheus.GaugeOpts{Name: "nstance_server_ready", Help: "r"})
	ready.Set(1)
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nstance_test_seconds", Help: "h"}, []string{"tenant"})
	hist.WithLabelValues("acme").Observe(1)
	reg.MustRegister(inst, age, created, ready, hist)

	want := `
# HELP nstance_server_drain_oldest_age_seconds a
# TYPE nstance_server_drain_oldest_age_seconds gauge
nstance_server_drain_oldest_age_seconds 90
# HELP nstance_server_instances i
# TYPE nstance_server_instances gauge
nstance_server_instances{state="pending"} 4
nstance_server_instances{state="running"} 6
# HELP nstance_server_ready r
# TYPE nstance_server_ready gauge
nstance_server_ready 1
# HELP nstance_test_created_total c
# TYPE nstance_test_created_total counter
nstance_test_created_total 12
`
	require.NoError(t, testutil.GatherAndCompare(metrics.Public(reg), bytes.NewBufferString(want)))
	// The full registry still names them.
	n, err := testutil.GatherAndCount(reg, "nstance_server_instances")
	require.NoError(t, err)
	require.Equal(t, 4, n)
}
