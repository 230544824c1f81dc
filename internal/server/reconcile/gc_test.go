package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Garbage collection is on by default and honours its interval on the fake
// clock: with a resync every minute, an interval of 10m and a grace period
// of 15m, an orphan first seen at 0 is still there at 15m (a pass every
// resync would have deleted it then) and is deleted by the pass at 20m.
func TestGarbageCollectionIntervalHonoured(t *testing.T) {
	b := newShardConfig(t)
	b.c.Shard.GarbageCollection = config.GarbageCollection{Interval: config.Duration(10 * time.Minute), GracePeriod: config.Duration(15 * time.Minute)}
	ctx := context.Background()
	orphan, err := instances.NewID("web")
	require.NoError(t, err)
	// Left before the term starts: the term's first pass sees it at 0.
	s := newShard(t, b.build(t), shardOptions{resync: time.Minute, prepare: func(s *shard) {
		_, err := s.p.Create(ctx, provider.CreateRequest{InstanceID: orphan, ProviderID: provider.ID("c1", "s1", orphan), Cluster: "c1", Shard: "s1"})
		require.NoError(t, err)
	}})
	exists := func() bool {
		_, err := s.p.Status(ctx, orphan)
		return err == nil
	}
	s.advance(t, 15*time.Minute)
	require.True(t, exists(), "grace over at 15m, but the next pass is due at 20m")
	s.advance(t, 4*time.Minute)
	require.True(t, exists(), "19m")
	s.advance(t, time.Minute)
	require.False(t, exists(), "deleted by the pass at 20m")
}

// Turned off, nothing is collected however long the orphan stays.
func TestGarbageCollectionOff(t *testing.T) {
	b := newShardConfig(t)
	b.c.Shard.GarbageCollection.Enabled = new(false)
	s := newShard(t, b.build(t), shardOptions{resync: time.Minute})
	ctx := context.Background()
	orphan, err := instances.NewID("web")
	require.NoError(t, err)
	_, err = s.p.Create(ctx, provider.CreateRequest{InstanceID: orphan, ProviderID: provider.ID("c1", "s1", orphan), Cluster: "c1", Shard: "s1"})
	require.NoError(t, err)
	s.term.Resync(t)
	s.advance(t, 2*time.Hour)
	_, err = s.p.Status(ctx, orphan)
	require.NoError(t, err, "still there")
}
