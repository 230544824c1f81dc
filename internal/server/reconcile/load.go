package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/nstance-dev/nstance/internal/server/instances"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// How a leadership term starts (the load path, apart from planning):
//
//  1. warm: the record index and the dynamic groups are filled from the
//     local cache (instances.Store.LoadCached, groups.Registry.LoadCached);
//     reads (List*, Get*, WatchInstances' pending drains) are served from
//     then on. Without a usable cache this step is skipped.
//  2. verify: the index is made equal to object storage (instances.Store.Sync
//     lists the records with their etags and reads only the changed ones;
//     the groups document is read again). What the cache had wrong is
//     announced to watchers.
//  3. act: only now do the workers start and do mutating operations
//     proceed, so a stale cache entry can never cause a create or a delete.

// errNotLeading is returned to callers waiting for a term that ended.
var errNotLeading = errors.New("the reconciler is not running (not the shard leader)")

func (r *Reconciler) await(ctx context.Context, pick func(*term) chan struct{}) error {
	t, ended := r.termOrEnded()
	if t == nil {
		if ended {
			return errNotLeading
		}
		return nil // never run: nothing was loaded that could be stale
	}
	select {
	case <-pick(t):
		return nil
	default:
	}
	select {
	case <-pick(t):
		return nil
	case <-t.done:
		return errNotLeading
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AwaitLoaded waits until the current term serves reads: the record index
// and groups hold the cache's or storage's content.
func (r *Reconciler) AwaitLoaded(ctx context.Context) error {
	return r.await(ctx, func(t *term) chan struct{} { return t.loaded })
}

// AwaitVerified waits until the current term checked its state against
// storage; every mutating operation (tenantops) waits for it.
func (r *Reconciler) AwaitVerified(ctx context.Context) error {
	return r.await(ctx, func(t *term) chan struct{} { return t.verified })
}

// Verified reports whether the current term's state was checked against
// storage (the workers run).
func (r *Reconciler) Verified() bool {
	t := r.curTerm()
	if t == nil {
		return false
	}
	select {
	case <-t.verified:
		return true
	default:
		return false
	}
}

// loadCached fills the index and groups from the cache; false when there
// is no usable cache (the term then waits for storage before serving).
func (r *Reconciler) loadCached(ctx context.Context) bool {
	n, ok, err := r.o.Instances.LoadCached(ctx)
	if err != nil {
		r.log.Error(err, "reading the cached records; loading from storage")
		return false
	}
	if !ok {
		return false
	}
	if _, gok, err := r.o.Groups.LoadCached(ctx); err != nil || !gok {
		if err != nil {
			r.log.Error(err, "reading the cached groups; loading from storage")
		}
		return false
	}
	r.o.Groups.SetStatic(r.o.Config())
	r.log.V(1).Info("state loaded from the cache", "instances", n)
	return true
}

// verify makes the index and groups equal to storage. After a warm start it
// announces what the cache had wrong: groups that changed, drains the cache
// did not know about, and records deleted meanwhile.
func (r *Reconciler) verify(ctx context.Context, warm bool) error {
	res, err := r.o.Instances.Sync(ctx)
	if err != nil {
		return fmt.Errorf("loading instances: %w", err)
	}
	changed, err := r.o.Groups.Load(ctx)
	if err != nil {
		return fmt.Errorf("loading groups: %w", err)
	}
	r.o.Groups.SetStatic(r.o.Config())
	r.log.V(1).Info("state checked against storage", "listed", res.Listed, "read", res.Fetched,
		"changed", len(res.Changed), "removed", len(res.Removed), "warm", warm)
	if !warm {
		return nil
	}
	for _, k := range changed {
		r.GroupChanged(k)
	}
	for _, id := range res.Changed {
		if rec, ok := r.o.Instances.Get(id); ok && rec.State == instances.StatePendingDeletion && !rec.DrainAcked {
			r.publishInstance(rec, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, rec.Message)
		}
	}
	for _, rec := range res.Removed {
		// Deleted by an earlier leader after this cache was written.
		r.publishInstance(rec, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED, "deleted")
	}
	return nil
}
