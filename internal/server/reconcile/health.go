package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/reconcile/planner"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// healthPersistEvery bounds how often LastHealthAt is written to storage.
const healthPersistEvery = time.Minute

// tuning is the health and surge tuning of the running config (the shard
// config is its only source), so a RefreshConfig applies it.
func (r *Reconciler) tuning() config.Tuning { return r.cfg().Shard.Tuning() }

// member is rec as the planner sees it, with its agent's last report.
func (r *Reconciler) member(rec *instances.Record) planner.Member {
	m := planner.Member{Record: rec}
	if live := r.monitored(); live != nil {
		if last, ok := live.LastReport(rec.ID); ok {
			m.LastReport = last
		}
	}
	return m
}

// healthTuning is the readiness rule of the running config and term.
func (r *Reconciler) healthTuning() planner.Health {
	t := r.tuning()
	return planner.Health{Monitor: r.monitored() != nil, Interval: t.HealthInterval, Misses: t.HealthMisses}
}

// ready reports whether an instance serves (see planner.Health.Ready).
func (r *Reconciler) ready(rec *instances.Record, now time.Time) bool {
	return r.healthTuning().Ready(r.member(rec), now)
}

// healthPass checks every created instance's report age: a missed report
// triggers a provider check, HealthMisses missed reports (or no report at
// all within StartupGrace) mark it unhealthy. Instances whose readiness
// changed wake their group.
func (r *Reconciler) healthPass(ctx context.Context, tm *term) {
	if tm.health == nil {
		return
	}
	termStart := tm.start
	now := r.o.Now()
	tun := r.tuning()
	interval := tun.HealthInterval
	wake := map[groups.Key]bool{}
	for _, rec := range r.o.Instances.List(func(x *instances.Record) bool {
		return x.State == instances.StateRunning || x.State == instances.StateCreating
	}) {
		last, ok := tm.health.LastReport(rec.ID)
		rdy := r.ready(rec, now)
		tm.healthMu.Lock()
		prevReady, known := tm.wasReady[rec.ID]
		tm.wasReady[rec.ID] = rdy
		checked := tm.checked[rec.ID]
		tm.healthMu.Unlock()
		if rec.GroupID != "" && known && prevReady != rdy {
			wake[groups.Key{Tenant: rec.Tenant, ID: rec.GroupID}] = true
		}
		// An instance that ran before this term had its agent connected to
		// the old leader: it gets the reconnect grace from the term start
		// before any verdict (every agent reconnects at once after a
		// failover, with backoff).
		takeover := rec.CreatedAt.Before(termStart)
		inGrace := takeover && now.Sub(termStart) < tun.ReconnectGrace
		if !ok {
			// No report in this term: a verdict once both the startup grace
			// (from creation) and, for an instance of an earlier term, the
			// reconnect grace (from the term start) are over.
			deadline, grace := rec.CreatedAt.Add(tun.StartupGrace), tun.StartupGrace
			if takeover {
				if d := termStart.Add(tun.ReconnectGrace); d.After(deadline) {
					deadline, grace = d, tun.ReconnectGrace
				}
			}
			if !now.Before(deadline) {
				r.markUnhealthy(ctx, rec, fmt.Sprintf("agent sent no health report within %s", grace))
			}
			continue
		}
		missed := int(now.Sub(last) / interval)
		switch {
		case missed >= tun.HealthMisses && inGrace:
			// No verdict yet; ask the provider whether it still runs.
			if missed > checked {
				tm.healthMu.Lock()
				tm.checked[rec.ID] = missed
				tm.healthMu.Unlock()
				r.EnqueueInstance(rec.ID)
			}
		case missed >= tun.HealthMisses:
			// A pass that runs late (a slow resync, a loaded machine) can see
			// every missed report at once, before any provider check ran. A
			// workload that is gone is recorded as stopped by the instance's
			// own reconcile, not called unhealthy: ask the provider first.
			if r.workloadGone(ctx, rec.ID) {
				r.EnqueueInstance(rec.ID)
				break
			}
			r.markUnhealthy(ctx, rec, fmt.Sprintf("agent missed %d health reports (last %s ago)", missed, now.Sub(last).Round(time.Millisecond)))
		case missed > checked:
			// A missed report: ask the provider whether the instance still runs.
			tm.healthMu.Lock()
			tm.checked[rec.ID] = missed
			tm.healthMu.Unlock()
			r.EnqueueInstance(rec.ID)
		case missed == 0 && checked > 0:
			tm.healthMu.Lock()
			delete(tm.checked, rec.ID)
			tm.healthMu.Unlock()
		}
		if rec.LastHealthAt == nil || last.Sub(*rec.LastHealthAt) >= healthPersistEvery {
			r.EnqueueInstance(rec.ID)
		}
	}
	for k := range wake {
		r.EnqueueGroup(k)
	}
}

// markUnhealthy moves an instance to unhealthy; its group replaces it first
// and drains it afterwards.
func (r *Reconciler) markUnhealthy(ctx context.Context, rec *instances.Record, msg string) {
	changed := false
	_, err := r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
		if x.State != instances.StateRunning && x.State != instances.StateCreating {
			return instances.ErrNoChange
		}
		x.State, x.Message, x.UpdatedAt = instances.StateUnhealthy, msg, r.o.Now().UTC()
		changed = true
		return nil
	})
	if err != nil {
		r.log.Error(err, "marking instance unhealthy", "instance", rec.ID)
		return
	}
	if !changed {
		return
	}
	r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_RECONCILE, fmt.Errorf("instance unhealthy: %s", msg))
	if rec.GroupID != "" {
		r.EnqueueGroup(groups.Key{Tenant: rec.Tenant, ID: rec.GroupID})
	}
}

// ReportedVersion is the agent version of instance id's latest report in
// this term ("" before one): readiness comes from the same reports, while
// the record's AgentVersion is written a queue pass later.
func (r *Reconciler) ReportedVersion(id string) string {
	if live := r.monitored(); live != nil {
		return live.Version(id)
	}
	return ""
}

// LastReport returns the last health report of the instance's agent in
// this term (nil before one, between terms, or when health is not monitored).
func (r *Reconciler) LastReport(id string) *nstancev1.HealthReport {
	if live := r.monitored(); live != nil {
		if rec, ok := live.Get(id); ok && rec.Reports > 0 {
			return rec.Last
		}
	}
	return nil
}

// noteHealth persists the last report time (throttled) and a termination
// notice on the record of an active instance.
func (r *Reconciler) noteHealth(ctx context.Context, rec *instances.Record) error {
	live := r.monitored()
	if live == nil {
		return nil
	}
	last, ok := live.LastReport(rec.ID)
	notice, version := live.Notice(rec.ID), live.Version(rec.ID)
	persist := ok && (rec.LastHealthAt == nil || last.Sub(*rec.LastHealthAt) >= healthPersistEvery)
	if !persist && (notice == "" || rec.TerminationNotice == notice) && (version == "" || rec.AgentVersion == version) {
		return nil
	}
	_, err := r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
		if !x.State.Active() {
			return instances.ErrNoChange
		}
		if persist {
			t := last.UTC()
			if x.LastHealthAt == nil && x.FirstHealthAt == nil {
				// The first report ever persisted: the start of the
				// instance's join deadline (the operator's join_timeout).
				f := t
				x.FirstHealthAt = &f
			}
			x.LastHealthAt = &t
		}
		if version != "" {
			x.AgentVersion = version
		}
		if notice != "" && x.TerminationNotice == "" {
			x.TerminationNotice = notice
			x.Message = "termination announced by the platform: " + notice
		}
		x.UpdatedAt = r.o.Now().UTC()
		return nil
	})
	return err
}

// forget drops what the term holds for a removed instance: the health
// pass's memory, its row of the live table, its keys and certificates in
// the Agent service.
func (r *Reconciler) forget(id string) {
	tm := r.curTerm()
	if tm == nil {
		return
	}
	tm.healthMu.Lock()
	delete(tm.wasReady, id)
	delete(tm.checked, id)
	tm.healthMu.Unlock()
	if tm.live != nil {
		tm.live.Forget(id)
	}
	if tm.files != nil {
		tm.files.Forget(id)
	}
}

// workloadGone reports whether the provider says the instance stopped or no
// longer exists. A provider error is not an answer: the caller goes on with
// what the missed reports say.
func (r *Reconciler) workloadGone(ctx context.Context, id string) bool {
	pctx, cancel := r.providerCtx(ctx)
	defer cancel()
	obs, err := r.o.Provider.Status(pctx, id)
	if errors.Is(err, provider.ErrNotFound) {
		return true
	}
	return err == nil && obs.State == provider.StateStopped
}

// vanishing acts on the signs that an instance's VM is going away while its
// provider still reports it running: its agent reported a host shutdown, or
// its last stream closed. It returns when to ask the provider again (0:
// not needed); past the shutdown grace the member is marked unhealthy, so
// its group replaces it first (planner.DecideVanish has the rules).
func (r *Reconciler) vanishing(ctx context.Context, rec *instances.Record) time.Duration {
	tm := r.curTerm()
	if tm == nil || tm.health == nil || rec.State != instances.StateRunning {
		return 0
	}
	p, ok := tm.health.Presence(rec.ID)
	if !ok {
		return 0
	}
	t, now := r.tuning(), r.o.Now()
	v := planner.DecideVanish(planner.Signs{ShutdownAt: p.ShutdownAt, DisconnectedAt: p.DisconnectedAt, Streams: p.Streams},
		now, t.ShutdownGrace, time.Duration(t.HealthMisses)*t.HealthInterval)
	if v.Replace {
		r.markUnhealthy(ctx, rec, fmt.Sprintf("agent reported its host shutting down %s ago and the provider still reports it running (shard.shutdown_grace %s)",
			now.Sub(p.ShutdownAt).Round(time.Millisecond), t.ShutdownGrace))
		return 0
	}
	if v.Recheck > 0 {
		// The checks after the first share the term's pace.
		if res := tm.probes.ReserveN(now, 1); res.OK() {
			v.Recheck = max(v.Recheck, res.DelayFrom(now))
		}
	}
	return v.Recheck
}
