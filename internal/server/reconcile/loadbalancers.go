package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// This file is the executor of the load balancer lifecycle; the decisions
// are loadbalancer.Decide and loadbalancer.Reconcile.

// lbBackoff is the retry schedule of one instance's failed calls to one
// load balancer: 1s doubling to a minute, with jitter.
func lbBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: time.Minute}
}

// lbRetry is the term's memory of failed calls for one instance at one
// load balancer.
type lbRetry struct {
	backoff   wait.Backoff
	notBefore time.Time
	lastErr   string
}

// lbMemory is what a term keeps of load balancer calls: retries by
// "instance/entry" and the entries whose membership was reconciled.
type lbMemory struct {
	mu         sync.Mutex
	retries    map[string]*lbRetry
	reconciled map[string]bool
}

func newLBMemory() *lbMemory {
	return &lbMemory{retries: map[string]*lbRetry{}, reconciled: map[string]bool{}}
}

// LBError returns the last failed call of instance id at entry lb in this
// term ("" when none failed or it succeeded since).
func (r *Reconciler) LBError(id, lb string) string {
	tm := r.curTerm()
	if tm == nil {
		return ""
	}
	tm.lb.mu.Lock()
	defer tm.lb.mu.Unlock()
	if rt := tm.lb.retries[id+"/"+lb]; rt != nil {
		return rt.lastErr
	}
	return ""
}

// WantLoadBalancers returns the load balancers rec's group registers it
// with: its static group's list, else its template's.
func (r *Reconciler) WantLoadBalancers(rec *instances.Record) []string {
	cfg := r.cfg()
	if g, ok := cfg.Groups[rec.Tenant][rec.GroupID]; ok && !rec.OnDemand {
		return cfg.GroupLoadBalancers(rec.Template, &g)
	}
	return cfg.GroupLoadBalancers(rec.Template, nil)
}

func lbTarget(rec *instances.Record) loadbalancer.Target {
	return loadbalancer.Target{InstanceID: rec.ID, Tenant: rec.Tenant, Group: rec.GroupID, Addresses: rec.Addresses}
}

// lbUsed reports whether rec has anything to do with load balancers.
func (r *Reconciler) lbUsed(rec *instances.Record) bool {
	return len(r.o.LoadBalancers) > 0 && (len(rec.LoadBalancers) > 0 || len(r.WantLoadBalancers(rec)) > 0)
}

// lbPending reports whether a resync should wake rec: it should be
// registered somewhere it is not.
func (r *Reconciler) lbPending(rec *instances.Record) bool {
	if !rec.State.Active() || rec.FirstHealthAt == nil || len(r.o.LoadBalancers) == 0 {
		return false
	}
	for _, n := range r.WantLoadBalancers(rec) {
		if _, ok := r.o.LoadBalancers[n]; ok && !rec.LoadBalancers[n].Live() {
			return true
		}
	}
	return false
}

// syncLoadBalancers makes the calls due for instance id and records their
// results. It returns how long until something more is due (0: nothing)
// and whether nothing of the instance is live at a load balancer any more.
// A failed call is reported and retried with backoff, not returned.
func (r *Reconciler) syncLoadBalancers(ctx context.Context, tm *term, id string) (time.Duration, bool, error) {
	if tm == nil {
		return 0, false, nil // the term ended
	}
	for range 4 { // a register, a deregister and a remove at most, then the answer
		rec, ok := r.o.Instances.Get(id)
		if !ok {
			return 0, true, nil
		}
		if !r.lbUsed(rec) {
			return 0, true, nil
		}
		now := r.o.Now()
		entries := make(map[string]loadbalancer.Entry, len(r.o.LoadBalancers))
		for name, p := range r.o.LoadBalancers {
			e := loadbalancer.Entry{}
			pctx, cancel := r.providerCtx(ctx)
			d, err := p.DeregistrationDelay(pctx)
			cancel()
			if err != nil {
				r.lbFailed(tm, rec, name, "deregistration delay", err)
				d = 0
			}
			e.Delay = d
			tm.lb.mu.Lock()
			if rt := tm.lb.retries[id+"/"+name]; rt != nil {
				e.NotBefore = rt.notBefore
			}
			tm.lb.mu.Unlock()
			entries[name] = e
		}
		in := loadbalancer.Instance{
			Leaving: !rec.State.Active(), Reported: rec.FirstHealthAt != nil, HasAddress: len(rec.Addresses) > 0,
			Want: r.WantLoadBalancers(rec), Targets: rec.LoadBalancers,
		}
		d := loadbalancer.Decide(now, in, entries)
		if len(d.Steps) == 0 {
			var wake time.Duration
			if !d.Wake.IsZero() {
				wake = max(d.Wake.Sub(now), time.Millisecond)
			}
			return wake, d.Released, nil
		}
		for _, s := range d.Steps {
			if err := r.lbStep(ctx, tm, rec, s); err != nil {
				return 0, false, err
			}
		}
	}
	return time.Millisecond, false, nil
}

// lbStep makes one call and records it. Only a failed record update is
// returned; a failed call is remembered for its retry.
func (r *Reconciler) lbStep(ctx context.Context, tm *term, rec *instances.Record, s loadbalancer.Step) error {
	p := r.o.LoadBalancers[s.LB]
	t := lbTarget(rec)
	pctx, cancel := r.providerCtx(ctx)
	var err error
	switch s.Op {
	case loadbalancer.OpRegister:
		err = p.Register(pctx, t)
	case loadbalancer.OpDeregister:
		err = p.Deregister(pctx, t)
	case loadbalancer.OpRemove:
		err = p.Remove(pctx, t)
	}
	cancel()
	if errors.Is(err, loadbalancer.ErrNotFound) && s.Op != loadbalancer.OpRegister {
		err = nil
	}
	if r.o.LBCalls != nil {
		r.o.LBCalls(s.LB, string(s.Op), err)
	}
	if err != nil {
		r.lbFailed(tm, rec, s.LB, string(s.Op), err)
		return nil
	}
	tm.lb.mu.Lock()
	delete(tm.lb.retries, rec.ID+"/"+s.LB)
	tm.lb.mu.Unlock()
	now := r.o.Now().UTC()
	_, err = r.o.Instances.Update(ctx, rec.ID, func(x *instances.Record) error {
		x.LoadBalancers = maps.Clone(x.LoadBalancers)
		if x.LoadBalancers == nil {
			x.LoadBalancers = map[string]loadbalancer.TargetState{}
		}
		st := x.LoadBalancers[s.LB]
		switch s.Op {
		case loadbalancer.OpRegister:
			st = loadbalancer.TargetState{Registered: &now}
		case loadbalancer.OpDeregister:
			st.Deregistered = &now
		case loadbalancer.OpRemove:
			st.Removed = true
		}
		x.LoadBalancers[s.LB] = st
		x.UpdatedAt = now
		return nil
	})
	if err != nil && !errors.Is(err, instances.ErrNotFound) {
		return fmt.Errorf("recording %s of %s at load balancer %s: %w", s.Op, rec.ID, s.LB, err)
	}
	r.log.V(1).Info("load balancer call", "instance", rec.ID, "loadBalancer", s.LB, "op", s.Op)
	return nil
}

// lbFailed reports a failed call and schedules its retry.
func (r *Reconciler) lbFailed(tm *term, rec *instances.Record, lb, what string, err error) {
	err = fmt.Errorf("load balancer %s: %s %s: %w", lb, what, rec.ID, err)
	r.reportError(rec.Tenant, rec.GroupID, rec.ID, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, err)
	tm.lb.mu.Lock()
	defer tm.lb.mu.Unlock()
	key := rec.ID + "/" + lb
	rt := tm.lb.retries[key]
	if rt == nil {
		rt = &lbRetry{backoff: lbBackoff()}
		tm.lb.retries[key] = rt
	}
	rt.notBefore = r.o.Now().Add(rt.backoff.Step())
	rt.lastErr = err.Error()
}

// releaseDrain ends the hold of a pending deletion once nothing of the
// instance is live at its load balancers: the drain deadline starts now
// and the pending deletion is announced (unless its drain is skipped).
func (r *Reconciler) releaseDrain(ctx context.Context, id string) error {
	now := r.o.Now().UTC()
	announce := false
	rec, err := r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
		if !x.DrainHeld {
			return instances.ErrNoChange
		}
		deadline := now.Add(r.drainTimeout(x))
		x.DrainHeld, x.DrainDeadline, x.UpdatedAt = false, &deadline, now
		announce = !x.DrainAcked
		return nil
	})
	if err != nil {
		if errors.Is(err, instances.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("releasing the drain of %s: %w", id, err)
	}
	if announce {
		r.publishInstance(rec, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, rec.Message)
	}
	return nil
}

// removeLeftovers deregisters and removes, at once and best effort, the
// live targets of an instance that is gone (its provider lost it).
func (r *Reconciler) removeLeftovers(ctx context.Context, rec *instances.Record) {
	for name, st := range rec.LoadBalancers {
		p, ok := r.o.LoadBalancers[name]
		if !ok || !st.Live() {
			continue
		}
		pctx, cancel := r.providerCtx(ctx)
		err := errors.Join(p.Deregister(pctx, lbTarget(rec)), p.Remove(pctx, lbTarget(rec)))
		cancel()
		if err != nil {
			r.log.Error(err, "removing a vanished instance from its load balancer (a later leadership start removes it)", "instance", rec.ID, "loadBalancer", name)
		}
	}
}

// reconcileLoadBalancers compares each entry's members with the records,
// once per term and entry (retried on every resync until it succeeds):
// strangers with our ownership are deregistered and removed, and targets
// lost behind our back are forgotten so that their instances register
// again. Foreign targets are not listed by Members, so never touched.
func (r *Reconciler) reconcileLoadBalancers(ctx context.Context, tm *term) {
	for name, p := range r.o.LoadBalancers {
		tm.lb.mu.Lock()
		done := tm.lb.reconciled[name]
		tm.lb.mu.Unlock()
		if done {
			continue
		}
		pctx, cancel := r.providerCtx(ctx)
		members, err := p.Members(pctx)
		cancel()
		if err != nil {
			r.reportError("", "", "", nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, fmt.Errorf("load balancer %s: listing members: %w", name, err))
			continue
		}
		records := map[string]loadbalancer.Record{}
		for _, rec := range r.o.Instances.List(nil) {
			want := false
			if rec.State.Active() {
				for _, n := range r.WantLoadBalancers(rec) {
					want = want || n == name
				}
			}
			if st, ok := rec.LoadBalancers[name]; ok || want {
				records[rec.ID] = loadbalancer.Record{Wanted: want, State: st}
			}
		}
		m := loadbalancer.Reconcile(members, records)
		failed := false
		for _, id := range m.Strangers {
			t := loadbalancer.Target{InstanceID: id}
			pctx, cancel := r.providerCtx(ctx)
			err := p.Deregister(pctx, t)
			if err == nil {
				err = p.Remove(pctx, t)
			}
			cancel()
			if r.o.LBCalls != nil {
				r.o.LBCalls(name, "remove_stranger", err)
			}
			if err != nil {
				failed = true
				r.reportError("", "", id, nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, fmt.Errorf("load balancer %s: removing stranger %s: %w", name, id, err))
			}
		}
		for _, id := range m.Lost {
			if _, err := r.o.Instances.Update(ctx, id, func(x *instances.Record) error {
				if !x.LoadBalancers[name].Live() {
					return instances.ErrNoChange
				}
				x.LoadBalancers = maps.Clone(x.LoadBalancers)
				delete(x.LoadBalancers, name)
				return nil
			}); err != nil && !errors.Is(err, instances.ErrNotFound) {
				failed = true
				r.log.Error(err, "forgetting a lost load balancer registration", "instance", id, "loadBalancer", name)
			}
			r.EnqueueInstance(id)
		}
		if !failed {
			tm.lb.mu.Lock()
			tm.lb.reconciled[name] = true
			tm.lb.mu.Unlock()
		}
	}
}
