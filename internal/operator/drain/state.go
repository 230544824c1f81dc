package drain

import (
	"cmp"
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

type drainState struct {
	providerID string
	group      string
	reason     nstancev1.DeletionReason
	deadline   time.Time
	// announced is when the pending deletion was first seen.
	announced time.Time
	started   bool
	acked     bool
	deleted   bool
	blocked   string
	// unreachable is the last workload-cluster error reported.
	unreachable string
}

// Observe records one instance event and enqueues the instance. It blocks
// while the queue is full rather than dropping the event.
func (c *Coordinator) Observe(ctx context.Context, shard string, ev *nstancev1.InstanceEvent) {
	key := Key{NamespacedName: types.NamespacedName{Namespace: cmp.Or(ev.GetShard(), shard), Name: ev.GetInstanceId()}}
	if key.Name == "" {
		return
	}
	c.mu.Lock()
	st := c.drains[key]
	switch ev.GetStatus() {
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION:
		if st == nil || st.deleted {
			st = &drainState{announced: time.Now()}
			c.drains[key] = st
		}
		st.providerID, st.group, st.reason = ev.GetProviderId(), ev.GetGroupId(), ev.GetReason()
		if d := ev.GetDrainDeadline(); d != nil {
			st.deadline = d.AsTime()
		}
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING:
		// The server no longer waits for us; a drain in progress stops.
		if st != nil {
			st.acked = true
		}
		c.mu.Unlock()
		return
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED:
		if st == nil {
			st = &drainState{}
			c.drains[key] = st
		}
		st.deleted, st.providerID = true, cmp.Or(ev.GetProviderId(), st.providerID)
	default:
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	select {
	case c.queue <- event.TypedGenericEvent[Key]{Object: key}:
	case <-ctx.Done():
	}
}

func (c *Coordinator) state(key Key) (drainState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.drains[key]
	if !ok {
		return drainState{}, false
	}
	return *st, true
}

func (c *Coordinator) update(key Key, fn func(*drainState)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.drains[key]; ok {
		fn(st)
	}
}

func (c *Coordinator) forget(key Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.drains, key)
}

// Pending returns the number of instances the coordinator is tracking.
func (c *Coordinator) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.drains)
}
