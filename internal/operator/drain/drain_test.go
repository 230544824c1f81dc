package drain

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestAckSettled(t *testing.T) {
	for code, settled := range map[codes.Code]bool{
		codes.NotFound:           true,
		codes.Aborted:            true,
		codes.FailedPrecondition: true,
		codes.Unavailable:        false,
		codes.Internal:           false,
		codes.PermissionDenied:   false,
		codes.DeadlineExceeded:   false,
	} {
		require.Equal(t, settled, ackSettled(status.Error(code, "x")), code.String())
	}
	require.True(t, ackSettled(nil), "OK")
}

func TestVMGone(t *testing.T) {
	st := func(s nstancev1.InstanceState, gone bool) *nstancev1.InstanceStatus {
		return &nstancev1.InstanceStatus{State: s, WorkloadGone: gone}
	}
	require.True(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_STOPPED, false)))
	require.True(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_DELETED, false)))
	require.True(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, true)))
	require.False(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, false)))
	require.False(t, vmGone(st(nstancev1.InstanceState_INSTANCE_STATE_RUNNING, false)))
}

func TestRetryAfter(t *testing.T) {
	c := &Coordinator{RetryInterval: 3 * time.Second}
	require.Equal(t, 3*time.Second, c.retryAfter(drainState{}))
	require.Equal(t, 3*time.Second, c.retryAfter(drainState{deadline: time.Now().Add(time.Hour)}))
	// A deadline already passed: the next pass comes at once (but not with
	// a zero or negative delay, which would mean "no requeue").
	require.Equal(t, time.Millisecond, c.retryAfter(drainState{deadline: time.Now().Add(-time.Hour)}))
	require.Equal(t, 2*time.Second, (&Coordinator{}).retryAfter(drainState{}))
}

func TestObserve(t *testing.T) {
	c := &Coordinator{drains: map[Key]*drainState{}, queue: make(chan event.TypedGenericEvent[Key], 8)}
	ctx := context.Background()
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	next := func() Key {
		t.Helper()
		select {
		case e := <-c.queue:
			return e.Object
		default:
			t.Fatal("nothing enqueued")
			return Key{}
		}
	}
	requireEmpty := func() {
		t.Helper()
		select {
		case e := <-c.queue:
			t.Fatalf("unexpected enqueue of %v", e.Object)
		default:
		}
	}

	// An event without an instance ID is ignored.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION})
	requireEmpty()
	require.Equal(t, 0, c.Pending())

	// Pending deletion: recorded under the event's shard and enqueued.
	c.Observe(ctx, "stream-shard", &nstancev1.InstanceEvent{
		Shard: "s1", InstanceId: "i-1", ProviderId: "nstance://s1/i-1", GroupId: "g",
		Status:        nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION,
		DrainDeadline: timestamppb.New(deadline),
	})
	key := Key{NamespacedName: client.ObjectKey{Namespace: "s1", Name: "i-1"}}
	require.Equal(t, key, next())
	st, ok := c.state(key)
	require.True(t, ok)
	require.Equal(t, "nstance://s1/i-1", st.providerID)
	require.Equal(t, "g", st.group)
	require.True(t, st.deadline.Equal(deadline))
	require.False(t, st.acked)

	// Deleting: the server stopped waiting; the drain stops, nothing enqueued.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-1", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING})
	requireEmpty()
	st, _ = c.state(key)
	require.True(t, st.acked)

	// Deleted: marked for cleanup and enqueued, keeping the provider ID.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-1", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED})
	require.Equal(t, key, next())
	st, _ = c.state(key)
	require.True(t, st.deleted)
	require.Equal(t, "nstance://s1/i-1", st.providerID)

	// Announced again after deletion (a new drain of a reused key): fresh state.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-1", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION})
	require.Equal(t, key, next())
	st, _ = c.state(key)
	require.False(t, st.deleted)
	require.False(t, st.acked)
	require.Empty(t, st.providerID)

	// Other statuses are ignored.
	c.Observe(ctx, "s1", &nstancev1.InstanceEvent{InstanceId: "i-2", Status: nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_UNSPECIFIED})
	requireEmpty()
	require.Equal(t, 1, c.Pending())
}

func TestDrainAnnounced(t *testing.T) {
	deadline := timestamppb.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	pending := nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION
	require.True(t, drainAnnounced(&nstancev1.InstanceStatus{State: pending, DrainDeadline: deadline}))
	require.False(t, drainAnnounced(&nstancev1.InstanceStatus{State: pending}), "held for load balancers: no deadline yet")
	require.False(t, drainAnnounced(&nstancev1.InstanceStatus{State: nstancev1.InstanceState_INSTANCE_STATE_RUNNING, DrainDeadline: deadline}))
}
