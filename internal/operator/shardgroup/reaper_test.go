package shardgroup

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/operator/ledger"
)

// TestDue: an orphaned group is deleted only on a shard that is configured
// and reachable again.
func TestDue(t *testing.T) {
	orphans := []ledger.Orphan{{Group: "web", Shard: "a"}, {Group: "db", Shard: "b"}, {Group: "web", Shard: "gone"}, {Group: "web", Shard: "c"}}
	known := func(s string) bool { return slices.Contains([]string{"a", "b", "c"}, s) }
	healthy := func(s string) bool { return s != "b" }
	require.Equal(t, []ledger.Orphan{{Group: "web", Shard: "a"}, {Group: "web", Shard: "c"}}, Due(orphans, known, healthy))
	require.Empty(t, Due(orphans, known, func(string) bool { return false }))
	require.Empty(t, Due(nil, known, healthy))
}
