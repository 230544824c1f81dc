package loadbalancer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	reg := loadbalancer.TargetState{Registered: at(-time.Hour)}
	dereg := func(ago time.Duration) loadbalancer.TargetState {
		return loadbalancer.TargetState{Registered: at(-time.Hour), Deregistered: at(-ago)}
	}
	entries := map[string]loadbalancer.Entry{"api": {Delay: 10 * time.Second}, "www": {Delay: 30 * time.Second}}
	step := func(lb string, op loadbalancer.Op) loadbalancer.Step { return loadbalancer.Step{LB: lb, Op: op} }
	ready := loadbalancer.Instance{Reported: true, HasAddress: true, Want: []string{"www", "api"}}
	with := func(in loadbalancer.Instance, leaving bool, targets map[string]loadbalancer.TargetState) loadbalancer.Instance {
		in.Leaving, in.Targets = leaving, targets
		return in
	}
	for _, c := range []struct {
		name    string
		in      loadbalancer.Instance
		entries map[string]loadbalancer.Entry
		want    loadbalancer.Decision
	}{
		{"no report yet: nothing", loadbalancer.Instance{HasAddress: true, Want: []string{"www"}}, entries,
			loadbalancer.Decision{Released: true}},
		{"no address yet: nothing", loadbalancer.Instance{Reported: true, Want: []string{"www"}}, entries,
			loadbalancer.Decision{Released: true}},
		{"first report: register with every wanted entry, in order", ready, entries,
			loadbalancer.Decision{Steps: []loadbalancer.Step{step("api", loadbalancer.OpRegister), step("www", loadbalancer.OpRegister)}, Released: true}},
		{"registered: nothing", with(ready, false, map[string]loadbalancer.TargetState{"www": reg, "api": reg}), entries,
			loadbalancer.Decision{Released: false}},
		{"one failed before: only the other, and a wake for the retry",
			with(ready, false, map[string]loadbalancer.TargetState{"api": reg}),
			map[string]loadbalancer.Entry{"api": {}, "www": {NotBefore: now.Add(2 * time.Second)}},
			loadbalancer.Decision{Wake: now.Add(2 * time.Second), Released: false}},
		{"retry due: register", with(ready, false, map[string]loadbalancer.TargetState{"api": reg}),
			map[string]loadbalancer.Entry{"api": {}, "www": {NotBefore: now}},
			loadbalancer.Decision{Steps: []loadbalancer.Step{step("www", loadbalancer.OpRegister)}, Released: false}},
		{"leaving: deregister every live target first",
			with(ready, true, map[string]loadbalancer.TargetState{"www": reg, "api": reg}), entries,
			loadbalancer.Decision{Steps: []loadbalancer.Step{step("api", loadbalancer.OpDeregister), step("www", loadbalancer.OpDeregister)}}},
		{"leaving: wait each entry's delay, wake at the first end",
			with(ready, true, map[string]loadbalancer.TargetState{"www": dereg(time.Second), "api": dereg(time.Second)}), entries,
			loadbalancer.Decision{Wake: now.Add(9 * time.Second)}},
		{"leaving: remove where the delay passed, wait for the other",
			with(ready, true, map[string]loadbalancer.TargetState{"www": dereg(20 * time.Second), "api": dereg(10 * time.Second)}), entries,
			loadbalancer.Decision{Steps: []loadbalancer.Step{step("api", loadbalancer.OpRemove)}, Wake: now.Add(10 * time.Second)}},
		{"leaving: all removed: released",
			with(ready, true, map[string]loadbalancer.TargetState{"www": {Registered: at(-time.Hour), Deregistered: at(-time.Minute), Removed: true}}), entries,
			loadbalancer.Decision{Released: true}},
		{"leaving, never registered: released at once", with(ready, true, nil), entries,
			loadbalancer.Decision{Released: true}},
		{"leaving before its first report: nothing to do",
			with(loadbalancer.Instance{Want: []string{"www"}}, true, nil), entries, loadbalancer.Decision{Released: true}},
		{"leaving, deregistration failed: held back, not released",
			with(ready, true, map[string]loadbalancer.TargetState{"www": reg}),
			map[string]loadbalancer.Entry{"www": {NotBefore: now.Add(time.Second)}},
			loadbalancer.Decision{Wake: now.Add(time.Second)}},
		{"an entry no longer wanted: deregistered while the instance stays",
			with(loadbalancer.Instance{Reported: true, HasAddress: true, Want: []string{"www"}}, false,
				map[string]loadbalancer.TargetState{"www": reg, "api": reg}), entries,
			loadbalancer.Decision{Steps: []loadbalancer.Step{step("api", loadbalancer.OpDeregister)}}},
		{"deregistered but wanted again (group changed back): register",
			with(ready, false, map[string]loadbalancer.TargetState{"www": dereg(time.Second), "api": reg}), entries,
			loadbalancer.Decision{Steps: []loadbalancer.Step{step("www", loadbalancer.OpRegister)}}},
		{"an entry gone from the config cannot be called: ignored",
			with(ready, true, map[string]loadbalancer.TargetState{"old": reg}), entries,
			loadbalancer.Decision{Released: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, loadbalancer.Decide(now, c.in, c.entries))
		})
	}
}

func TestReconcile(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	reg := loadbalancer.TargetState{Registered: &now}
	dereg := loadbalancer.TargetState{Registered: &now, Deregistered: &now}
	mem := func(id string, st loadbalancer.MemberState) loadbalancer.Member {
		return loadbalancer.Member{InstanceID: id, State: st}
	}
	for _, c := range []struct {
		name    string
		members []loadbalancer.Member
		records map[string]loadbalancer.Record
		want    loadbalancer.Membership
	}{
		{"in step", []loadbalancer.Member{mem("a", loadbalancer.MemberActive), mem("b", loadbalancer.MemberDraining)},
			map[string]loadbalancer.Record{"a": {Wanted: true, State: reg}, "b": {State: dereg}},
			loadbalancer.Membership{}},
		{"a member without a record, or whose instance does not want it, is a stranger",
			[]loadbalancer.Member{mem("x", loadbalancer.MemberActive), mem("c", loadbalancer.MemberActive), mem("a", loadbalancer.MemberActive)},
			map[string]loadbalancer.Record{"a": {Wanted: true, State: reg}, "c": {State: loadbalancer.TargetState{Registered: &now, Removed: true}}},
			loadbalancer.Membership{Strangers: []string{"c", "x"}}},
		{"removed or drained behind our back: lost (registered again)",
			[]loadbalancer.Member{mem("b", loadbalancer.MemberDraining)},
			map[string]loadbalancer.Record{"a": {Wanted: true, State: reg}, "b": {Wanted: true, State: reg}},
			loadbalancer.Membership{Lost: []string{"a", "b"}}},
		{"a wanted instance the records do not know as registered is no stranger (Decide registers it)",
			[]loadbalancer.Member{mem("a", loadbalancer.MemberActive)},
			map[string]loadbalancer.Record{"a": {Wanted: true}},
			loadbalancer.Membership{}},
		{"deregistered and gone already: nothing", nil,
			map[string]loadbalancer.Record{"b": {State: dereg}}, loadbalancer.Membership{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, loadbalancer.Reconcile(c.members, c.records))
		})
	}
}
