package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// A member marked with MarkForScaleDown keeps running (nothing replaces it)
// and is the one the next scale-down removes, even though the scale-down
// would otherwise take the newest member; with skip_drain no drain is
// announced.
func TestMarkedMemberGoesFirstOnScaleDown(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	ctx := context.Background()
	sub := s.events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	s.upsert(t, "web", 3, time.Minute)
	// Distinct creation times: the scale-down order looks at them.
	s.upsert(t, "web", 1, time.Minute)
	s.advance(t, time.Minute)
	s.upsert(t, "web", 2, time.Minute)
	s.advance(t, time.Second)
	s.upsert(t, "web", 3, time.Minute)
	_ = drain(sub.Events())
	members := s.running("web")
	require.Len(t, members, 3)
	slices.SortFunc(members, func(a, b *instances.Record) int { return a.CreatedAt.Compare(b.CreatedAt) })
	victim := members[0].ID // the oldest: an unmarked scale-down takes the newest

	rec, err := s.ops.MarkForScaleDown(ctx, "t", victim, true)
	require.NoError(t, err)
	require.True(t, rec.ScaleDownFirst)
	require.Equal(t, instances.StateRunning, rec.State, "the mark deletes nothing")
	// Marking twice is a no-op.
	_, err = s.ops.MarkForScaleDown(ctx, "t", victim, true)
	require.NoError(t, err)
	s.run(t)
	creates, _ := s.p.Counts()
	s.upsert(t, "web", 2, time.Minute)
	_, exists := s.insts.Get(victim)
	require.False(t, exists, "the marked member is removed, without waiting for a drain (no clock moved)")
	require.ElementsMatch(t, []string{members[1].ID, members[2].ID}, s.ids("web"), "no other member removed")
	after, _ := s.p.Counts()
	require.Equal(t, creates, after, "nothing replaced the marked member")
	deleted := false
	for _, ev := range drain(sub.Events()) {
		require.NotEqual(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus(), "skip_drain: no drain announced")
		deleted = deleted || (ev.GetInstanceId() == victim && ev.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED)
	}
	require.True(t, deleted, "a deleted event for the marked member")
}

func TestMarkForScaleDownRefusesOnDemand(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	s.upsert(t, "web", 0, 0)
	rec, err := s.ops.CreateInstance(context.Background(), "t", tenantops.CreateInstanceRequest{GroupID: "web"})
	require.NoError(t, err)
	_, err = s.ops.MarkForScaleDown(context.Background(), "t", rec.ID, false)
	require.True(t, errors.Is(err, tenantops.ErrInvalid), "%v", err)
	_, err = s.ops.MarkForScaleDown(context.Background(), "other", rec.ID, false)
	require.True(t, errors.Is(err, tenantops.ErrNotFound), "another tenant's instance: %v", err)
}
