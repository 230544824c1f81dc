package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// drain_timeout 0 disables the drain: a scale-down deletes the member at
// once, with no pending-deletion announcement and no clock moved; unset is
// the shard's default_drain_timeout (30s in the test config), and a set
// timeout is the deadline.
func TestDrainTimeoutZeroDeletesWithoutDrain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drain *durationpb.Duration
		// wantDrain is the drain deadline's distance from the deletion
		// (0: deleted without a drain).
		wantDrain time.Duration
	}{
		{"unset: the shard's default", nil, 30 * time.Second},
		{"set", durationpb.New(time.Minute), time.Minute},
		{"zero: no drain", durationpb.New(0), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShard(t, newShardConfig(t).build(t), shardOptions{})
			ctx := context.Background()
			sub := s.events.Instances.Subscribe("t")
			t.Cleanup(sub.Close)
			upsert := func(size uint32) {
				_, _, err := s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: size, DrainTimeout: tc.drain}, "")
				require.NoError(t, err)
				s.run(t)
			}
			upsert(1)
			members := s.running("web")
			require.Len(t, members, 1)
			victim := members[0]
			require.Equal(t, tc.wantDrain == 0, victim.NoDrain)
			got := s.group(t, "web").SpecProto().GetDrainTimeout()
			require.Equal(t, tc.drain == nil, got == nil, "the group's drain timeout reads back as set or unset")
			_ = drain(sub.Events())

			upsert(0)
			rec, exists := s.insts.Get(victim.ID)
			evs := drain(sub.Events())
			if tc.wantDrain == 0 {
				require.False(t, exists, "deleted at once, no clock moved")
				for _, ev := range evs {
					require.NotEqual(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus(), "no drain announced")
				}
				require.Equal(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED, evs[len(evs)-1].GetStatus())
				return
			}
			require.True(t, exists, "waits for its drain")
			require.Equal(t, instances.StatePendingDeletion, rec.State)
			require.True(t, s.clk.Now().Add(tc.wantDrain).Equal(*rec.DrainDeadline), "deadline %s", rec.DrainDeadline)
			require.Equal(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, evs[0].GetStatus())
		})
	}
}

// CreateInstance's drain_timeout 0 overrides a group's drain timeout: the
// on-demand instance is deleted without a drain.
func TestCreateInstanceDrainTimeoutZero(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	ctx := context.Background()
	s.upsert(t, "web", 0, time.Hour)
	rec, err := s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{GroupID: "web", DrainTimeout: new(time.Duration(0))})
	require.NoError(t, err)
	require.True(t, rec.NoDrain)
	s.run(t)
	require.NoError(t, s.r.BeginDeletion(ctx, rec.ID, nstancev1.DeletionReason_DELETION_REASON_ON_DEMAND_DELETE, false, "test"))
	s.run(t)
	_, exists := s.insts.Get(rec.ID)
	require.False(t, exists, "deleted without waiting for a drain")
}
