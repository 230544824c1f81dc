package loadbalancer

import (
	"sort"
	"time"
)

// TargetState is what the server persists of one instance at one load
// balancer (in the instance's record, by entry name).
type TargetState struct {
	// Registered is when Register last succeeded.
	Registered *time.Time `json:"registered,omitempty"`
	// Deregistered is when Deregister succeeded; the entry's delay runs
	// from it.
	Deregistered *time.Time `json:"deregistered,omitempty"`
	// Removed is set once Remove succeeded: nothing is left at the load
	// balancer.
	Removed bool `json:"removed,omitempty"`
}

// Live reports whether the target may still get or finish connections:
// registered and not yet removed.
func (s TargetState) Live() bool { return s.Registered != nil && !s.Removed }

// Op is one call to a load balancer.
type Op string

// Operations.
const (
	OpRegister   Op = "register"
	OpDeregister Op = "deregister"
	OpRemove     Op = "remove"
)

// Step is one call the executor makes for an instance.
type Step struct {
	LB string
	Op Op
}

// Instance is what Decide needs of one instance.
type Instance struct {
	// Leaving is set once the instance is on its way out (pending deletion
	// or deleting): every target is deregistered, waits its delay and is
	// removed.
	Leaving bool
	// Reported is set once its agent's first health report is in: only
	// then is it registered.
	Reported bool
	// HasAddress: the provider reported an address (registration waits
	// for one).
	HasAddress bool
	// Want are the load balancers of its group (entries of the running
	// config).
	Want []string
	// Targets are its persisted states, by entry.
	Targets map[string]TargetState
}

// Entry is what Decide needs of one load balancer entry.
type Entry struct {
	// Delay is the entry's deregistration delay.
	Delay time.Duration
	// NotBefore holds back a call to this entry for the instance after a
	// failure (the executor's backoff); zero: none.
	NotBefore time.Time
}

// Decision is what to do now for one instance.
type Decision struct {
	Steps []Step
	// Wake is the earliest time something more is due (a delay ending, a
	// backoff passing); zero: nothing is waited for.
	Wake time.Time
	// Released: nothing of the instance is live at any load balancer it
	// can reach. An instance on its way out may go on to its drain and
	// termination only then.
	Released bool
}

// Decide returns the calls due now for one instance, in entry order.
// Entries absent from entries (removed from the config, so without a
// provider) cannot be called and are ignored. An instance that is not
// leaving is registered with every wanted entry once it reported and has
// an address; a target of an entry it no longer wants, or of a leaving
// instance, is deregistered, then removed once its entry's delay has
// passed since the deregistration.
func Decide(now time.Time, in Instance, entries map[string]Entry) Decision {
	want := map[string]bool{}
	if !in.Leaving {
		for _, n := range in.Want {
			want[n] = true
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var d Decision
	d.Released = true
	wake := func(t time.Time) {
		if d.Wake.IsZero() || t.Before(d.Wake) {
			d.Wake = t
		}
	}
	for _, n := range names {
		e, st := entries[n], in.Targets[n]
		var op Op
		switch {
		case want[n]:
			if st.Live() {
				d.Released = false
			}
			if st.Live() && st.Deregistered == nil || !in.Reported || !in.HasAddress {
				continue
			}
			op = OpRegister // new, or deregistered and wanted again
		case !st.Live():
			continue
		case st.Deregistered == nil:
			op = OpDeregister
		default:
			if due := st.Deregistered.Add(e.Delay); now.Before(due) {
				d.Released = false
				wake(due)
				continue
			}
			op = OpRemove
		}
		if op != OpRegister {
			d.Released = false
		}
		if now.Before(e.NotBefore) {
			wake(e.NotBefore)
			continue
		}
		d.Steps = append(d.Steps, Step{LB: n, Op: op})
	}
	return d
}

// Membership is what Reconcile found wrong between one load balancer's
// members and the records.
type Membership struct {
	// Strangers are members with this shard's ownership that no instance
	// wants there (no record, or leaving without a live target there):
	// deregister and remove them.
	Strangers []string
	// Lost are instances whose record says registered (and not
	// deregistered) but that the load balancer does not hold, or holds
	// other than active (removed or drained behind our back): forget the
	// registration so that Decide registers them again (or, leaving, has
	// nothing left to wait for).
	Lost []string
}

// Record is what Reconcile needs of one instance record for one entry.
type Record struct {
	// Wanted: an instance not leaving whose group wants this entry.
	Wanted bool
	State  TargetState
}

// Reconcile compares one entry's members (those with our ownership) with
// the records, by instance id, on leadership start.
func Reconcile(members []Member, records map[string]Record) Membership {
	var m Membership
	active := map[string]bool{}
	for _, mem := range members {
		active[mem.InstanceID] = mem.State == MemberActive
		rec, ok := records[mem.InstanceID]
		if ok && (rec.Wanted || rec.State.Live()) {
			// Ours and known: Decide registers it (a lost answer) or
			// carries its deregistration on.
			continue
		}
		m.Strangers = append(m.Strangers, mem.InstanceID)
	}
	for id, rec := range records {
		if rec.State.Live() && rec.State.Deregistered == nil && !active[id] {
			m.Lost = append(m.Lost, id)
		}
	}
	sort.Strings(m.Strangers)
	sort.Strings(m.Lost)
	return m
}
