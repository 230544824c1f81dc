package planner

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Group is what the planner needs to know about a group.
type Group struct {
	// Exists is false once the group was deleted: every active member goes.
	Exists bool
	// Size is the number of members the group asks for.
	Size int
	// Infra is what the group's spec resolves to now. Nil when it does not
	// resolve (a config error): no member then counts as drifted.
	Infra *groups.Effective
	// Expiry holds the shard's member age limits (zero: off).
	Expiry Expiry
	// MaxUnavailable is how many members below the size may be ready while
	// drifted members are rotated out (0: a drifted member goes only once
	// the other ready members cover the size).
	MaxUnavailable int
	// Paused stops the rotation: no drifted member is rotated out and no
	// surge member created for one.
	Paused bool
}

// Expiry holds the age limits of group members.
type Expiry struct {
	// ForcedAge removes a member regardless of anything else.
	ForcedAge time.Duration
	// EligibleAge replaces the oldest member, one at a time, while the group
	// is at full size and healthy.
	EligibleAge time.Duration
}

// Member is one instance record of the group with what its agent last said.
type Member struct {
	*instances.Record
	// LastReport is when the member's agent last reported this term; zero
	// when it has not.
	LastReport time.Time
}

// Health is the readiness tuning of the shard.
type Health struct {
	// Monitor is true when agents report health (providers with agents);
	// false means a member is ready once the provider runs it.
	Monitor bool
	// Interval is the expected report interval and Misses how many missed
	// reports make a member not ready.
	Interval time.Duration
	Misses   int
}

// Ready reports whether m serves: running at the provider and, with
// monitoring on, its agent reported within the allowed misses.
func (h Health) Ready(m Member, now time.Time) bool {
	if m.State != instances.StateRunning {
		return false
	}
	if !h.Monitor {
		return true
	}
	return !m.LastReport.IsZero() && now.Sub(m.LastReport) < time.Duration(h.Misses)*h.Interval
}

// Deletion is a member to announce pending-deletion, and why.
type Deletion struct {
	ID      string
	Reason  nstancev1.DeletionReason
	Message string
}

// Plan is what a group needs next: the executor starts the deletions in
// order, then creates Creates members (subject to the create rate limits).
type Plan struct {
	Creates   int
	Deletions []Deletion
}

// Messages of the deletions, as announced on WatchInstances.
const (
	MsgGroupDeleted   = "group deleted"
	MsgForcedExpiry   = "instance reached expiry.forced_age"
	MsgEligibleExpiry = "instance reached expiry.eligible_age"
	MsgRotated        = "rotated: infra settings changed"
	msgScaledTo       = "group scaled to %d"
	msgReplacedPrefix = "replaced: "
)

// Urgent reports whether a member must be replaced as soon as possible:
// unhealthy, stopped, or its termination announced by the platform.
func Urgent(rec *instances.Record) bool {
	return rec.State == instances.StateUnhealthy || rec.State == instances.StateStopped || rec.TerminationNotice != ""
}

// Drifted reports whether rec was created with other infra settings
// (template, instance type, subnet pool, args, the bootstrap data the
// tenant sent) than eff. Vars are not infra: their changes are pushed to
// the running agent instead.
func Drifted(rec *instances.Record, eff groups.Effective) bool {
	return rec.Template != eff.Template || rec.InstanceType != eff.InstanceType || rec.SubnetPool != eff.SubnetPool ||
		!maps.Equal(rec.Args, eff.Args) || rec.UserDataSHA256 != eff.UserDataSHA256
}

// PlanGroup decides the next step of group g with the given members (any
// order; on-demand instances and members of other groups must not be in it,
// on-demand ones are skipped). surge is how many members beyond the size a
// rotation may run. See the package doc for the rules.
func PlanGroup(g Group, members []Member, now time.Time, h Health, surge int) Plan {
	var p Plan
	del := func(m Member, reason nstancev1.DeletionReason, msg string) {
		p.Deletions = append(p.Deletions, Deletion{ID: m.ID, Reason: reason, Message: msg})
	}
	var active []Member
	draining := 0
	for _, m := range members {
		switch {
		case m.OnDemand:
		case m.State.Active():
			active = append(active, m)
		default:
			draining++
		}
	}
	if !g.Exists {
		for _, m := range active {
			del(m, nstancev1.DeletionReason_DELETION_REASON_GROUP_DELETED, MsgGroupDeleted)
		}
		return p
	}

	// Expiry.
	keep := make([]Member, 0, len(active))
	for _, m := range active {
		if older(m, now, g.Expiry.ForcedAge) {
			del(m, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, MsgForcedExpiry)
			continue
		}
		keep = append(keep, m)
	}
	size := g.Size
	if g.Expiry.EligibleAge > 0 && draining == 0 && len(keep) == size && size > 0 {
		allRunning := true
		oldest := keep[0]
		for _, m := range keep {
			if m.State != instances.StateRunning || Urgent(m.Record) {
				allRunning = false
			}
			if m.CreatedAt.Before(oldest.CreatedAt) {
				oldest = m
			}
		}
		if allRunning && older(oldest, now, g.Expiry.EligibleAge) {
			del(oldest, nstancev1.DeletionReason_DELETION_REASON_EXPIRY, MsgEligibleExpiry)
			keep = without(keep, oldest.ID)
		}
	}

	// Classify: urgent and drifted members are replaced first and go once
	// enough ready members remain.
	var urgents, drifted, fresh []Member
	for _, m := range keep {
		switch {
		case Urgent(m.Record):
			urgents = append(urgents, m)
		case g.Infra != nil && Drifted(m.Record, *g.Infra):
			drifted = append(drifted, m)
		default:
			fresh = append(fresh, m)
		}
	}

	// Scale down: members beyond the size (and the surge a rotation in
	// progress may use) go. A paused group creates no surge member and
	// keeps only those a rotation started before the pause and that are not
	// ready yet: removing a ready drifted member for one would leave fewer
	// ready members than the size. Once ready, the oldest drifted member
	// makes room by scale-down, as for any excess.
	surgeKept := min(surge, len(drifted))
	if g.Paused {
		starting := 0
		for _, m := range fresh {
			if !h.Ready(m, now) {
				starting++
			}
		}
		surge, surgeKept = 0, min(surgeKept, starting)
	}
	if excess := len(fresh) + len(drifted) - size - surgeKept; excess > 0 {
		order := markedFirst(append(ScaleDownOrder(drifted), ScaleDownOrder(fresh)...))
		for _, m := range order[:excess] {
			del(m, nstancev1.DeletionReason_DELETION_REASON_SCALE_DOWN, fmt.Sprintf(msgScaledTo, size))
			drifted, fresh = without(drifted, m.ID), without(fresh, m.ID)
		}
	}

	// Serving capacity: ready fresh and drifted members.
	capacity := 0
	ready := map[string]bool{}
	for _, m := range append(slices.Clone(fresh), drifted...) {
		if h.Ready(m, now) {
			ready[m.ID] = true
			capacity++
		}
	}

	// Replace urgent members: once capacity covers the size, or at once for
	// those beyond the size (their replacements are failing as well).
	byAge(urgents)
	left := urgents[:0:0]
	for i, m := range urgents {
		if capacity < size && len(urgents)-i <= size {
			left = append(left, urgents[i:]...)
			break
		}
		reason := nstancev1.DeletionReason_DELETION_REASON_UNHEALTHY
		if m.TerminationNotice != "" {
			reason = nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION
		}
		del(m, reason, msgReplacedPrefix+m.Message)
	}
	urgents = left

	// Rotate drifted members while the remaining ready ones cover the size
	// less the unavailability the group allows.
	byAge(drifted)
	for _, m := range slices.Clone(drifted) {
		if g.Paused {
			break
		}
		after := capacity
		if ready[m.ID] {
			after--
		}
		if after < size-g.MaxUnavailable {
			break
		}
		del(m, nstancev1.DeletionReason_DELETION_REASON_ROTATION, MsgRotated)
		capacity = after
		drifted = without(drifted, m.ID)
	}

	// Create fresh members up to the size, within the surge allowance.
	nActive := len(fresh) + len(drifted) + len(urgents)
	allow := size + min(len(urgents), size) + min(surge, len(drifted))
	p.Creates = max(0, min(size-len(fresh), allow-nActive))
	return p
}

func older(m Member, now time.Time, age time.Duration) bool {
	return age > 0 && now.Sub(m.CreatedAt) >= age
}

func without(ms []Member, id string) []Member {
	out := ms[:0:0]
	for _, m := range ms {
		if m.ID != id {
			out = append(out, m)
		}
	}
	return out
}

func byAge(ms []Member) {
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].CreatedAt.Before(ms[j].CreatedAt) })
}

// ScaleDownOrder returns ms in the order a scale-down removes them: those
// not running (stopped, unhealthy, then still starting) first, then the
// newest; ties by id, highest first.
func ScaleDownOrder(ms []Member) []Member {
	rank := func(s instances.State) int {
		switch s {
		case instances.StateStopped:
			return 0
		case instances.StateUnhealthy:
			return 1
		case instances.StatePending, instances.StateCreating:
			return 2
		}
		return 3
	}
	out := slices.Clone(ms)
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i].State), rank(out[j].State)
		if ri != rj {
			return ri < rj
		}
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID > out[j].ID
	})
	return out
}

// markedFirst moves the members marked by MarkForScaleDown to the front,
// keeping the order otherwise.
func markedFirst(ms []Member) []Member {
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].ScaleDownFirst && !ms[j].ScaleDownFirst })
	return ms
}
