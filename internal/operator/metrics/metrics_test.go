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
