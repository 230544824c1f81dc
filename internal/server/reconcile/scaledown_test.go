package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/reconcile"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// A member marked with MarkForScaleDown keeps running (nothing replaces it)
// and is the one the next scale-down removes, even though the scale-down
// would otherwise take the newest member; with skip_drain no drain is
// announced.
func TestMarkedMemberGoesFirstOnScaleDown(t *testing.T) {
	e := start(t, nil, nil)
	ctx := context.Background()
	sub := e.f.Events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	upsert(t, e, "web", 3, time.Minute)
	require.Eventually(t, func() bool { return len(running(e, "web")) == 3 }, 5*time.Second, 10*time.Millisecond)
	members := running(e, "web")
	slices.SortFunc(members, func(a, b *instances.Record) int { return a.CreatedAt.Compare(b.CreatedAt) })
	victim := members[0].ID // the oldest: an unmarked scale-down takes the newest

	rec, err := e.f.Reconciler.MarkForScaleDown(ctx, "t", victim, true)
	require.NoError(t, err)
	require.True(t, rec.ScaleDownFirst)
	require.Equal(t, instances.StateRunning, rec.State, "the mark deletes nothing")
	// Marking twice is a no-op.
	_, err = e.f.Reconciler.MarkForScaleDown(ctx, "t", victim, true)
	require.NoError(t, err)
	upsert(t, e, "web", 2, time.Minute)
	require.Eventually(t, func() bool {
		_, exists := e.f.Instances.Get(victim)
		return !exists
	}, 5*time.Second, 10*time.Millisecond, "the marked member is removed, without waiting for a drain")
	var ids []string
	for _, r := range e.f.Instances.ListGroup("t", "web") {
		ids = append(ids, r.ID)
	}
	require.ElementsMatch(t, []string{members[1].ID, members[2].ID}, ids, "no other member removed")
	creates, _ := e.p.Counts()
	require.Equal(t, 3, creates, "nothing replaced the marked member")
	for {
		select {
		case ev := <-sub.Events():
			require.NotEqual(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, ev.GetStatus(), "skip_drain: no drain announced")
			if ev.GetInstanceId() == victim && ev.GetStatus() == nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED {
				return
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no deleted event for the marked member")
		}
	}
}

func TestMarkForScaleDownRefusesOnDemand(t *testing.T) {
	e := start(t, nil, nil)
	upsert(t, e, "web", 0, 0)
	rec, err := e.f.Reconciler.CreateInstance(context.Background(), "t", reconcile.CreateInstanceRequest{GroupID: "web"})
	require.NoError(t, err)
	_, err = e.f.Reconciler.MarkForScaleDown(context.Background(), "t", rec.ID, false)
	require.True(t, errors.Is(err, reconcile.ErrInvalid), "%v", err)
	_, err = e.f.Reconciler.MarkForScaleDown(context.Background(), "other", rec.ID, false)
	require.True(t, errors.Is(err, reconcile.ErrNotFound), "another tenant's instance: %v", err)
}
