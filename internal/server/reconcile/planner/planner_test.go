package planner

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

var now = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// infra is what the test groups resolve to; members match it unless drifted.
var infra = groups.Effective{Template: "worker", InstanceType: "small", SubnetPool: "default", Args: map[string]string{"a": "1"}}

type opt func(*Member)

// member builds a member created age ago in state st.
func member(id string, age time.Duration, st instances.State, opts ...opt) Member {
	m := Member{Record: &instances.Record{ID: id, Tenant: "t", GroupID: "g", State: st, CreatedAt: now.Add(-age),
		Template: infra.Template, InstanceType: infra.InstanceType, SubnetPool: infra.SubnetPool, Args: map[string]string{"a": "1"}}}
	for _, o := range opts {
		o(&m)
	}
	return m
}

func reported(ago time.Duration) opt { return func(m *Member) { m.LastReport = now.Add(-ago) } }
func notice(kind string) opt         { return func(m *Member) { m.TerminationNotice = kind } }
func marked() opt                    { return func(m *Member) { m.ScaleDownFirst = true } }
func onDemand() opt                  { return func(m *Member) { m.OnDemand = true } }
func msg(s string) opt               { return func(m *Member) { m.Message = s } }
func driftType() opt                 { return func(m *Member) { m.InstanceType = "large" } }
func driftArgs() opt                 { return func(m *Member) { m.Args = map[string]string{"a": "2"} } }
func driftVars() opt                 { return func(m *Member) { m.Vars = map[string]string{"v": "changed"} } }

const (
	running   = instances.StateRunning
	creating  = instances.StateCreating
	pending   = instances.StatePending
	unhealthy = instances.StateUnhealthy
	stopped   = instances.StateStopped
	pendDel   = instances.StatePendingDeletion
	deleting  = instances.StateDeleting
)

// reasons name the deletion reasons in the tables: "id:reason".
var reasons = map[nstancev1.DeletionReason]string{
	nstancev1.DeletionReason_DELETION_REASON_SCALE_DOWN:       "scale_down",
	nstancev1.DeletionReason_DELETION_REASON_EXPIRY:           "expiry",
	nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY:        "unhealthy",
	nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION: "spot",
	nstancev1.DeletionReason_DELETION_REASON_ROTATION:         "rotation",
	nstancev1.DeletionReason_DELETION_REASON_GROUP_DELETED:    "group_deleted",
}

func group(size int) Group { return Group{Exists: true, Size: size, Infra: &infra} }

var (
	noHealth = Health{}
	monitor  = Health{Monitor: true, Interval: 30 * time.Second, Misses: 3}
)

func TestPlanGroup(t *testing.T) {
	h := time.Hour
	cases := []struct {
		name    string
		group   Group
		members []Member
		health  Health
		surge   int
		creates int
		deletes []string // "id:reason", in the order the plan lists them
	}{
		// Scale up.
		{name: "scale up an empty group", group: group(3), creates: 3},
		{name: "empty group of size zero does nothing", group: group(0)},
		{name: "scale up a partly created group", group: group(3), members: []Member{member("a", h, running)}, creates: 2},
		{name: "pending creates count toward the size", group: group(3),
			members: []Member{member("a", h, pending), member("b", h, creating), member("c", h, running)}},
		{name: "on-demand instances are not members", group: group(2),
			members: []Member{member("a", h, running, onDemand()), member("b", 100*h, running, onDemand())}, creates: 2},
		{name: "drains in progress do not count toward the size", group: group(2),
			members: []Member{member("a", h, pendDel), member("b", h, deleting)}, creates: 2},
		{name: "group at its size does nothing", group: group(2),
			members: []Member{member("a", h, running), member("b", h, running)}},

		// Scale down and its order.
		{name: "scale down removes the newest first", group: group(1),
			members: []Member{member("a", 3*h, running), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"c:scale_down", "b:scale_down"}},
		{name: "scale down removes starting members before running ones", group: group(1),
			members: []Member{member("a", 3*h, running), member("b", 4*h, creating), member("c", 5*h, pending), member("d", h, running)},
			deletes: []string{"b:scale_down", "c:scale_down", "d:scale_down"}},
		{name: "scale down ties on creation time go by id, highest first", group: group(1),
			members: []Member{member("a", h, running), member("c", h, running), member("b", h, running)},
			deletes: []string{"c:scale_down", "b:scale_down"}},
		{name: "a member marked for scale-down goes first even when oldest", group: group(2),
			members: []Member{member("a", 9*h, running, marked()), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"a:scale_down"}},
		{name: "a marked member stays while the size holds", group: group(2),
			members: []Member{member("a", 9*h, running, marked()), member("b", 2*h, running)}},
		{name: "scale to zero removes every member", group: group(0),
			members: []Member{member("a", 2*h, running), member("b", h, creating)},
			deletes: []string{"b:scale_down", "a:scale_down"}},
		{name: "urgent members are not scale-down candidates", group: group(1),
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"c:scale_down", "a:unhealthy"}},

		// Expiry.
		{name: "forced expiry removes an old member and replaces it", group: withExpiry(group(2), 10*h, 0),
			members: []Member{member("a", 11*h, running), member("b", h, running)},
			deletes: []string{"a:expiry"}, creates: 1},
		{name: "forced expiry wins over an unhealthy member's replacement", group: withExpiry(group(2), 10*h, 0),
			members: []Member{member("a", 11*h, unhealthy), member("b", h, running)},
			deletes: []string{"a:expiry"}, creates: 1},
		{name: "forced expiry off when zero", group: group(1),
			members: []Member{member("a", 1000*h, running)}},
		{name: "forced expiry then scale down of the rest", group: withExpiry(group(1), 10*h, 0),
			members: []Member{member("a", 11*h, running), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"a:expiry", "c:scale_down"}},
		{name: "eligible expiry replaces only the oldest", group: withExpiry(group(3), 0, 5*h),
			members: []Member{member("a", 7*h, running), member("b", 9*h, running), member("c", 6*h, running)},
			deletes: []string{"b:expiry"}, creates: 1},
		{name: "eligible expiry waits for a drain in progress", group: withExpiry(group(2), 0, 5*h),
			members: []Member{member("a", 7*h, running), member("b", 9*h, running), member("c", 8*h, pendDel)}},
		{name: "eligible expiry waits while below the size", group: withExpiry(group(3), 0, 5*h),
			members: []Member{member("a", 7*h, running), member("b", 9*h, running)}, creates: 1},
		{name: "eligible expiry waits while a member starts", group: withExpiry(group(2), 0, 5*h),
			members: []Member{member("a", 7*h, running), member("b", 9*h, creating)}},
		{name: "eligible expiry waits while a member is announced for termination", group: withExpiry(group(2), 0, 5*h),
			members: []Member{member("a", 7*h, running, notice("spot")), member("b", 9*h, running)}, creates: 1},
		{name: "eligible expiry leaves young members", group: withExpiry(group(2), 0, 5*h),
			members: []Member{member("a", 4*h, running), member("b", 3*h, running)}},
		{name: "eligible expiry does nothing at size zero", group: withExpiry(group(0), 0, 5*h)},

		// Unhealthy replacement.
		{name: "unhealthy member is replaced before it goes", group: group(2),
			members: []Member{member("a", 2*h, unhealthy), member("b", h, running)}, creates: 1},
		{name: "unhealthy member goes once its replacement is ready", group: group(2),
			members: []Member{member("a", 3*h, unhealthy, msg("agent missed 3 health reports")), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"a:unhealthy"}},
		{name: "unhealthy member waits for a replacement still starting", group: group(2),
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running), member("c", h, creating)}},
		{name: "stopped member is replaced like an unhealthy one", group: group(1),
			members: []Member{member("a", 2*h, stopped), member("b", h, running)}, deletes: []string{"a:unhealthy"}},
		{name: "urgent members beyond the size go at once", group: group(1),
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, unhealthy), member("c", h, stopped)},
			deletes: []string{"a:unhealthy", "b:unhealthy"}, creates: 1},
		{name: "urgent members of a size-zero group go at once", group: group(0),
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, stopped)},
			deletes: []string{"a:unhealthy", "b:unhealthy"}},
		{name: "several urgent members go oldest first once covered", group: group(1),
			members: []Member{member("b", 2*h, unhealthy), member("a", 3*h, stopped), member("c", h, running)},
			deletes: []string{"a:unhealthy", "b:unhealthy"}},
		{name: "replacements of urgent members are capped at the size", group: group(2),
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, unhealthy)}, creates: 2},

		// Spot interruption.
		{name: "spot notice: replacement first", group: group(2),
			members: []Member{member("a", 2*h, running, notice("spot")), member("b", h, running)}, creates: 1},
		{name: "spot notice: member goes once the replacement is ready", group: group(2),
			members: []Member{member("a", 3*h, running, notice("spot")), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"a:spot"}},
		{name: "spot notice on an unhealthy member still says spot", group: group(1),
			members: []Member{member("a", 3*h, unhealthy, notice("maintenance")), member("b", h, running)},
			deletes: []string{"a:spot"}},

		// Health monitoring decides readiness.
		{name: "monitoring: a replacement that never reported is not ready", group: group(2), health: monitor,
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running, reported(time.Second)), member("c", h, running)}},
		{name: "monitoring: a report older than the allowed misses is not ready", group: group(2), health: monitor,
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running, reported(time.Second)), member("c", h, running, reported(90*time.Second))}},
		{name: "monitoring: a recent report makes the replacement ready", group: group(2), health: monitor,
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running, reported(time.Second)), member("c", h, running, reported(89*time.Second))},
			deletes: []string{"a:unhealthy"}},

		// Rotation with surge.
		{name: "rotation creates the surge first", group: group(2), surge: 1,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType())}, creates: 1},
		{name: "rotation with surge 2 creates two at once", group: group(2), surge: 2,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType())}, creates: 2},
		{name: "rotation retires the oldest drifted member once covered", group: group(2), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running, driftType()), member("c", h, running)},
			deletes: []string{"a:rotation"}, creates: 1},
		{name: "rotation waits for the surge member to be ready", group: group(2), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running, driftType()), member("c", h, creating)}},
		{name: "rotation finishes with the last drifted member", group: group(2), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"a:rotation"}},
		// Rollout strategy: max unavailable, paused.
		{name: "max unavailable 1 without surge retires first, then creates", group: unavailable(group(2), 1), surge: 0,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType())},
			deletes: []string{"a:rotation"}, creates: 1},
		{name: "max unavailable 2 retires two at once", group: unavailable(group(3), 2), surge: 0,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running, driftType()), member("c", h, running, driftType())},
			deletes: []string{"a:rotation", "b:rotation"}, creates: 2},
		{name: "max unavailable: the drifted member beyond the size goes while its replacement starts", group: unavailable(group(2), 1), surge: 0,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType()), member("c", 0, creating)},
			deletes: []string{"b:scale_down"}},
		{name: "max unavailable is spent by a member not yet ready", group: unavailable(group(2), 1), surge: 0,
			members: []Member{member("a", 2*h, running, driftType()), member("c", 0, creating)}},
		{name: "surge and unavailable together", group: unavailable(group(2), 1), surge: 1,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType())},
			deletes: []string{"a:rotation"}, creates: 2},
		{name: "paused: drifted members stay, no surge", group: paused(group(2)), surge: 1,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType())}},
		{name: "paused: a ready surge member does not retire a drifted one by rotation", group: paused(group(2)), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running), member("c", h, running)},
			deletes: []string{"a:scale_down"}},
		{name: "paused: a surge member not ready yet is kept, no ready drifted one goes for it", group: paused(group(2)), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running, driftType()), member("c", h, creating)}},
		{name: "paused: a drifted member beyond the size still goes on scale-down", group: paused(group(1)), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running, driftType())},
			deletes: []string{"b:scale_down"}},
		{name: "paused: scale up creates fresh members", group: paused(group(3)), surge: 1,
			members: []Member{member("a", 2*h, running, driftType()), member("b", h, running, driftType())}, creates: 1},
		{name: "paused: unhealthy members are still replaced", group: paused(group(2)), surge: 1,
			members: []Member{member("a", 2*h, unhealthy, driftType()), member("b", h, running, driftType())}, creates: 1},
		{name: "changed args are drift", group: group(1), surge: 1,
			members: []Member{member("a", h, running, driftArgs())}, creates: 1},
		{name: "changed vars are not drift", group: group(1), surge: 1,
			members: []Member{member("a", h, running, driftVars())}},
		{name: "no drift is judged when the group does not resolve", group: Group{Exists: true, Size: 1}, surge: 1,
			members: []Member{member("a", h, running, driftType())}},
		{name: "scale down during rotation removes drifted members first", group: group(1), surge: 1,
			members: []Member{member("a", 3*h, running, driftType()), member("b", 2*h, running, driftType()), member("c", h, running, driftType())},
			deletes: []string{"c:scale_down", "a:rotation"}, creates: 1},
		{name: "drifted members go before fresh ones on scale down", group: group(1), surge: 1,
			members: []Member{member("a", 3*h, running), member("b", 2*h, running), member("c", 4*h, running, driftType())},
			deletes: []string{"c:scale_down"}},

		// Group deleted.
		{name: "deleted group loses every active member", group: Group{Exists: false, Size: 3},
			members: []Member{member("a", h, running), member("b", h, unhealthy), member("c", h, pendDel), member("d", h, running, onDemand())},
			deletes: []string{"a:group_deleted", "b:group_deleted"}},

		// Interactions.
		{name: "unhealthy and drifted: the unhealthy member goes first", group: group(2), surge: 1,
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running, driftType()), member("c", h, running)},
			deletes: []string{"a:unhealthy"}, creates: 1},
		{name: "unhealthy with its replacement pending: nothing more", group: group(2),
			members: []Member{member("a", 3*h, unhealthy), member("b", 2*h, running), member("c", h, pending)}},
		{name: "forced expiry with a drain in progress still creates", group: withExpiry(group(2), 10*h, 0),
			members: []Member{member("a", 11*h, running), member("b", h, running), member("c", h, pendDel)},
			deletes: []string{"a:expiry"}, creates: 1},
	}
	require.GreaterOrEqual(t, len(cases), 30)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.members)
			got := PlanGroup(tc.group, in, now, tc.health, tc.surge)
			var dels []string
			for _, d := range got.Deletions {
				dels = append(dels, d.ID+":"+reasons[d.Reason])
			}
			require.Equal(t, tc.deletes, dels, "deletions")
			require.Equal(t, tc.creates, got.Creates, "creates")
			require.Equal(t, tc.members, in, "the members passed in are left as they were")
			neverBelowSize(t, tc.group, tc.members, got, tc.health)
		})
	}
}

// neverBelowSize checks the rule every plan keeps: replacing (unhealthy,
// spot) and rotating never takes the ready members below the size, unless
// the urgent ones are themselves beyond it.
func neverBelowSize(t *testing.T, g Group, members []Member, p Plan, h Health) {
	t.Helper()
	gone := map[string]bool{}
	for _, d := range p.Deletions {
		if d.Reason == nstancev1.DeletionReason_DELETION_REASON_ROTATION {
			gone[d.ID] = true
		}
	}
	before, after := 0, 0
	for _, m := range members {
		if m.OnDemand || !m.State.Active() || Urgent(m.Record) || !h.Ready(m, now) {
			continue
		}
		before++
		if !gone[m.ID] {
			after++
		}
	}
	if len(gone) > 0 {
		require.GreaterOrEqual(t, after, g.Size-g.MaxUnavailable, "rotation took the ready members below the size less max unavailable")
	}
	if g.Paused {
		require.Empty(t, gone, "a paused group rotates nothing")
	}
	require.LessOrEqual(t, after, before)
}

func unavailable(g Group, n int) Group { g.MaxUnavailable = n; return g }
func paused(g Group) Group             { g.Paused = true; return g }

// TestRolloutBounds plays a rotation of 6 drifted members forward for each
// strategy, with creates becoming ready one step later, and checks the
// bounds at every step: never more than size+surge active members, never
// fewer than size-unavailable ready ones, and every member up to date at
// the end.
func TestRolloutBounds(t *testing.T) {
	for _, tc := range []struct{ surge, unavailable int }{{1, 0}, {2, 0}, {0, 1}, {1, 1}, {0, 2}, {3, 2}} {
		t.Run(fmt.Sprintf("surge %d unavailable %d", tc.surge, tc.unavailable), func(t *testing.T) {
			g := unavailable(group(6), tc.unavailable)
			var cur []Member
			for i := range 6 {
				cur = append(cur, member(fmt.Sprintf("old%d", i), time.Duration(10-i)*time.Hour, running, driftType()))
			}
			n := 0
			for step := 0; step < 50; step++ {
				// Members created in the last step become ready now.
				for i := range cur {
					if cur[i].State == creating {
						cur[i].State = running
					}
				}
				p := PlanGroup(g, cur, now, noHealth, tc.surge)
				if p.Creates == 0 && len(p.Deletions) == 0 {
					break
				}
				for _, d := range p.Deletions {
					cur = slices.DeleteFunc(cur, func(m Member) bool { return m.ID == d.ID })
				}
				ready := 0
				for _, m := range cur {
					if m.State == running {
						ready++
					}
				}
				require.GreaterOrEqual(t, ready, 6-tc.unavailable, "step %d: ready members", step)
				for i := 0; i < p.Creates; i++ {
					n++
					cur = append(cur, member(fmt.Sprintf("new%02d", n), 0, creating))
				}
				require.LessOrEqual(t, len(cur), 6+tc.surge, "step %d: active members", step)
			}
			require.Len(t, cur, 6)
			for _, m := range cur {
				require.False(t, Drifted(m.Record, infra), "%s is left", m.ID)
			}
		})
	}
}

func withExpiry(g Group, forced, eligible time.Duration) Group {
	g.Expiry = Expiry{ForcedAge: forced, EligibleAge: eligible}
	return g
}

func TestPlanGroupMessages(t *testing.T) {
	p := PlanGroup(group(1), []Member{
		member("a", 3*time.Hour, unhealthy, msg("agent missed 3 health reports")),
		member("b", 2*time.Hour, running), member("c", time.Hour, running),
	}, now, noHealth, 1)
	require.Equal(t, []Deletion{
		{ID: "c", Reason: nstancev1.DeletionReason_DELETION_REASON_SCALE_DOWN, Message: "group scaled to 1"},
		{ID: "a", Reason: nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY, Message: "replaced: agent missed 3 health reports"},
	}, p.Deletions)
	p = PlanGroup(withExpiry(group(1), time.Hour, 0), []Member{member("a", 2*time.Hour, running)}, now, noHealth, 1)
	require.Equal(t, []Deletion{{ID: "a", Reason: nstancev1.DeletionReason_DELETION_REASON_EXPIRY, Message: MsgForcedExpiry}}, p.Deletions)
}

// TestPlanGroupConverges plays plans forward (deletions done at once,
// creates become ready members) from assorted starting points and checks
// that each group ends at its size with no drifted or urgent member left,
// in a bounded number of steps.
func TestPlanGroupConverges(t *testing.T) {
	starts := map[string][]Member{
		"rotate three":      {member("a", 3*time.Hour, running, driftType()), member("b", 2*time.Hour, running, driftType()), member("c", time.Hour, running, driftType())},
		"unhealthy and old": {member("a", 3*time.Hour, unhealthy), member("b", 2*time.Hour, stopped), member("c", time.Hour, running, notice("spot"))},
		"too many":          {member("a", 3*time.Hour, running), member("b", 2*time.Hour, running), member("c", time.Hour, running), member("d", time.Minute, running, driftType())},
	}
	for name, ms := range starts {
		for _, surge := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s surge %d", name, surge), func(t *testing.T) {
				cur := slices.Clone(ms)
				n := 0
				for step := 0; step < 20; step++ {
					p := PlanGroup(group(2), cur, now, noHealth, surge)
					if p.Creates == 0 && len(p.Deletions) == 0 {
						break
					}
					for _, d := range p.Deletions {
						cur = slices.DeleteFunc(cur, func(m Member) bool { return m.ID == d.ID })
					}
					for i := 0; i < p.Creates; i++ {
						n++
						cur = append(cur, member(fmt.Sprintf("new%02d", n), 0, running))
					}
				}
				require.Len(t, cur, 2)
				for _, m := range cur {
					require.False(t, Urgent(m.Record) || Drifted(m.Record, infra), "%s is left", m.ID)
				}
			})
		}
	}
}
