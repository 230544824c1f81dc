package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/ptr"

	"github.com/nstance-dev/nstance/internal/server/groups"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestRolloutPausedAndResumed: an instance-type change on a paused group
// rotates nothing (up_to_date_count stays 0, no instance is created or
// deleted); resumed with max_surge 0 and max_unavailable 1 it replaces one
// member at a time, never running more than the size, until every member
// is up to date. The strategy round-trips through the stored group.
func TestRolloutPausedAndResumed(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	ctx := context.Background()
	spec := &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 3}
	_, _, err := s.ops.UpsertGroup(ctx, "t", spec, "")
	require.NoError(t, err)
	s.run(t)
	require.Len(t, s.running("web"), 3)
	status := func() *nstancev1.GroupStatus { return s.r.GroupStatus(s.group(t, "web")) }
	require.EqualValues(t, 3, status().GetUpToDateCount())

	spec.InstanceType = "test.large"
	spec.Rollout = &nstancev1.RolloutStrategy{Paused: true}
	_, _, err = s.ops.UpsertGroup(ctx, "t", spec, "")
	require.NoError(t, err)
	creates, deletes := s.p.Counts()
	s.advance(t, time.Second)
	c2, d2 := s.p.Counts()
	require.Equal(t, [2]int{creates, deletes}, [2]int{c2, d2}, "a paused group rotates nothing")
	require.Zero(t, status().GetUpToDateCount())
	require.True(t, proto.Equal(spec.Rollout, status().GetSpec().GetRollout()), "the strategy is stored: %v", status().GetSpec().GetRollout())

	spec.Rollout = &nstancev1.RolloutStrategy{MaxSurge: proto.Uint32(0), MaxUnavailable: 1}
	_, _, err = s.ops.UpsertGroup(ctx, "t", spec, "")
	require.NoError(t, err)
	for step := 0; step < 100 && status().GetUpToDateCount() < 3; step++ {
		s.advance(t, 10*time.Millisecond)
		active := 0
		for _, r := range s.insts.ListGroup("t", "web") {
			if r.State.Active() {
				active++
			}
		}
		require.LessOrEqual(t, active, 3, "max_surge 0: never more than the size")
	}
	require.EqualValues(t, 3, status().GetUpToDateCount())
	for _, r := range s.running("web") {
		require.Equal(t, "test.large", r.InstanceType)
	}
	g := s.group(t, "web")
	require.Equal(t, groups.Rollout{MaxSurge: ptr.To(0), MaxUnavailable: 1}, g.Spec.Rollout)
}

// TestRolloutStrategyValidated: both bounds 0 and out-of-range values are
// refused with the field named; nothing is stored.
func TestRolloutStrategyValidated(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	ctx := context.Background()
	for name, r := range map[string]*nstancev1.RolloutStrategy{
		"rollout":                 {MaxSurge: proto.Uint32(0)},
		"rollout.max_surge":       {MaxSurge: proto.Uint32(groups.MaxSize + 1)},
		"rollout.max_unavailable": {MaxUnavailable: groups.MaxSize + 1},
	} {
		_, _, err := s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 1, Rollout: r}, "")
		require.ErrorContains(t, err, name, "%v", r)
		_, ok := s.groups.Get(groups.Key{Tenant: "t", ID: "web"})
		require.False(t, ok, "%s: nothing stored", name)
	}
}

// TestImageChangeRollsTheGroup: a new GroupSpec.image makes every member
// drift (it is the reserved arg "image") and the group rolls onto it; the
// image round-trips through the stored group.
func TestImageChangeRollsTheGroup(t *testing.T) {
	s := newShard(t, newShardConfig(t).build(t), shardOptions{})
	ctx := context.Background()
	spec := &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 2, Image: "img-1"}
	_, _, err := s.ops.UpsertGroup(ctx, "t", spec, "")
	require.NoError(t, err)
	s.run(t)
	status := func() *nstancev1.GroupStatus { return s.r.GroupStatus(s.group(t, "web")) }
	require.EqualValues(t, 2, status().GetUpToDateCount())

	spec.Image = "img-2"
	_, _, err = s.ops.UpsertGroup(ctx, "t", spec, "")
	require.NoError(t, err)
	require.Zero(t, status().GetUpToDateCount(), "every member drifted")
	require.Equal(t, "img-2", status().GetSpec().GetImage())
	sts := s.ops.ListInstances("t", []string{"web"}, nil, false)
	require.Len(t, sts, 2)
	for _, st := range sts {
		require.True(t, st.GetDrifted(), "%s is outdated", st.GetInstanceId())
	}
	for step := 0; step < 100 && status().GetUpToDateCount() < 2; step++ {
		s.advance(t, 10*time.Millisecond)
	}
	require.EqualValues(t, 2, status().GetUpToDateCount())
	for _, r := range s.running("web") {
		require.Equal(t, "img-2", r.Args["image"])
		require.False(t, s.ops.Status(r).GetDrifted(), "%s is up to date", r.ID)
	}
}
