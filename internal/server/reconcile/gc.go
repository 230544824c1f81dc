package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// gcDue reports whether a garbage collection pass runs now: collection is
// on and none ran this term (last is zero) or the last one is at least
// gc.Interval old. gc has its defaults applied.
func gcDue(gc config.GarbageCollection, last, now time.Time) bool {
	return gc.On() && (last.IsZero() || now.Sub(last) >= gc.Interval.D())
}

// orphanVerdicts compares the provider's instances (listed) with the
// records (known): every listed instance without a record is an orphan,
// first seen at seen[id] or now. It returns the first sightings to keep
// (orphans still present; those no longer listed or claimed by a record are
// forgotten) and the orphans to delete: those seen on an earlier pass and
// unclaimed for at least grace.
func orphanVerdicts(listed []string, known map[string]bool, seen map[string]time.Time, now time.Time, grace time.Duration) (next map[string]time.Time, collect []string) {
	next = map[string]time.Time{}
	for _, id := range listed {
		if known[id] {
			continue
		}
		first, ok := seen[id]
		if !ok {
			first = now
		}
		next[id] = first
		if ok && now.Sub(first) >= grace {
			collect = append(collect, id)
		}
	}
	return next, collect
}

// collectGarbage runs a garbage collection pass when one is due
// (gcDue): provider instances orphaned for the grace period are deleted
// (only when the provider's list was read, listedOK) and stored user data
// no group or record names and older than the grace period is pruned.
func (r *Reconciler) collectGarbage(ctx context.Context, tm *term, listed []provider.Instance, listedOK bool, known map[string]bool, recs []*instances.Record) {
	gc := r.o.Config().Shard.GarbageCollection.WithDefaults()
	now := r.o.Now()
	if !gcDue(gc, tm.lastGC, now) {
		return
	}
	tm.lastGC = now
	if listedOK {
		r.collectOrphans(ctx, tm, listed, known, now, gc.GracePeriod.D())
	}
	r.pruneUserData(ctx, recs, now, gc.GracePeriod.D())
}

func (r *Reconciler) collectOrphans(ctx context.Context, tm *term, listed []provider.Instance, known map[string]bool, now time.Time, grace time.Duration) {
	ids := make([]string, 0, len(listed))
	for _, inst := range listed {
		ids = append(ids, inst.InstanceID)
	}
	next, collect := orphanVerdicts(ids, known, tm.orphans, now, grace)
	for _, id := range collect {
		// Re-check: a record may have been created since the list.
		if _, has := r.o.Instances.Get(id); has {
			continue
		}
		r.log.Info("deleting orphaned provider instance", "instance", id, "first_seen", next[id])
		if err := r.o.Provider.Delete(ctx, id); err != nil {
			r.reportError("", "", id, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, fmt.Errorf("deleting orphan: %w", err))
			continue
		}
		delete(next, id)
	}
	tm.orphans = next
}

// pruneUserData deletes stored bootstrap data that no group and no
// instance record names any more, once it is older than grace.
func (r *Reconciler) pruneUserData(ctx context.Context, recs []*instances.Record, now time.Time, grace time.Duration) {
	if r.o.PruneUserData == nil {
		return
	}
	used := map[[2]string]bool{}
	for _, g := range r.o.Groups.List("") {
		if g.Spec.UserDataSHA256 != "" {
			used[[2]string{g.Tenant, g.Spec.UserDataSHA256}] = true
		}
	}
	for _, rec := range recs {
		if rec.UserDataSHA256 != "" {
			used[[2]string{rec.Tenant, rec.UserDataSHA256}] = true
		}
	}
	n, err := r.o.PruneUserData(ctx, func(tenant, sum string) bool { return used[[2]string{tenant, sum}] }, now.Add(-grace))
	if err != nil {
		r.reportError("", "", "", nstancev1.ErrorSource_ERROR_SOURCE_RECONCILE, fmt.Errorf("pruning unused user data: %w", err))
	}
	if n > 0 {
		r.log.Info("deleted user data no group or instance names", "objects", n)
	}
}
