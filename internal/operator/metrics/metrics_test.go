package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	require.NoError(t, err)
	m.ObserveSync("a", "upsert", 10*time.Millisecond, nil)
	m.ObserveSync("a", "upsert", 20*time.Millisecond, errors.New("x"))
	m.StreamReconnected("b", "groups")
	m.StreamReconnected("b", "groups")
	m.SetShardUp("a", true)
	m.SetShardUp("b", false)
	m.Imported(3)

	require.Equal(t, 2.0, testutil.ToFloat64(m.streamReconnects.WithLabelValues("b", "groups")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.shardUp.WithLabelValues("a")))
	require.Equal(t, 0.0, testutil.ToFloat64(m.shardUp.WithLabelValues("b")))
	require.Equal(t, 3.0, testutil.ToFloat64(m.imported))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nstance_operator_group_sync_duration_seconds Duration of group sync calls (UpsertGroup, DeleteGroup) to a shard, by result.
# TYPE nstance_operator_group_sync_duration_seconds histogram
`), "nstance_operator_group_sync_duration_seconds_none"))
	count, err := testutil.GatherAndCount(reg, "nstance_operator_group_sync_duration_seconds")
	require.NoError(t, err)
	require.Equal(t, 2, count)

	// Registering twice fails loudly instead of silently sharing state.
	_, err = New(reg)
	require.Error(t, err)

	var none *Metrics
	none.ObserveSync("a", "upsert", time.Second, nil)
	none.SetShardUp("a", true)
}

func TestDrainAndEvictionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	require.NoError(t, err)
	pending := 2
	require.NoError(t, m.WatchDrains(func() int { return pending }))
	m.Evicted(EvictionEvicted)
	m.Evicted(EvictionEvicted)
	m.Evicted(EvictionBlocked)
	m.DrainDone("s1", false, 3*time.Second)
	m.DrainDone("s1", true, 0)
	require.Equal(t, 2.0, testutil.ToFloat64(m.evictions.WithLabelValues(EvictionEvicted)))
	require.Equal(t, 1.0, testutil.ToFloat64(m.evictions.WithLabelValues(EvictionBlocked)))
	require.Equal(t, 0.0, testutil.ToFloat64(m.evictions.WithLabelValues(EvictionError)))
	require.Equal(t, 2, testutil.CollectAndCount(m.drainDuration))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nstance_operator_drains_pending Drains the operator tracks: announced and not yet finished (the instance not yet deleted).
# TYPE nstance_operator_drains_pending gauge
nstance_operator_drains_pending 2
`), "nstance_operator_drains_pending"))
	pending = 0
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nstance_operator_drains_pending Drains the operator tracks: announced and not yet finished (the instance not yet deleted).
# TYPE nstance_operator_drains_pending gauge
nstance_operator_drains_pending 0
`), "nstance_operator_drains_pending"))
	require.Error(t, m.WatchDrains(func() int { return 0 }), "registered once")
	var nilM *Metrics
	nilM.Evicted(EvictionGone)
	nilM.DrainDone("s", false, time.Second)
	require.NoError(t, nilM.WatchDrains(func() int { return 0 }))
}
