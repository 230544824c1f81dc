package machinepool

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// ShardState is what the rollout planner knows of one shard's group.
type ShardState struct {
	Shard string
	// Size is the size the shard's group gets in this pass.
	Size int32
	// Known: the server confirmed the infra settings the pool asks for now
	// (the shard group's status.observedInfra), so Replicas and UpToDate
	// count against them. An unknown shard counts as not up to date.
	Known bool
	// Replicas and UpToDate are the server's actual_size and
	// up_to_date_count.
	Replicas, UpToDate int32
	// Budget: the shard's group holds the rollout budget now (its
	// spec.rollout has a maxSurge; paused or not: a paused pool keeps its
	// holder, so a resumed rollout goes on where it stopped).
	Budget bool
}

// done reports whether every member of the shard is up to date. A shard
// that is done runs no surge member either: a surge member exists only
// while a member that is not up to date does.
func (s ShardState) done() bool { return s.Known && s.UpToDate >= s.Replicas }

// RolloutPlan is what a pool's rollout needs next.
type RolloutPlan struct {
	// Budgets is each shard's rollout strategy: the rolling shard gets the
	// pool's whole budget, every other shard is paused.
	Budgets map[string]infrav1.ShardRollout
	// Rolling is the shard given the budget, "" when none is (nothing to
	// roll). While the rollout is paused it holds the budget, paused.
	Rolling string
	// Outdated lists the shards with members that are not up to date (or
	// whose state is unknown), in the pool's shard order.
	Outdated []string
	// UpToDate counts the members, over all shards, that are up to date
	// (an unknown shard counts none).
	UpToDate int32
}

// RollingOut reports whether some shard has members that are not up to date.
func (p RolloutPlan) RollingOut() bool { return len(p.Outdated) > 0 }

// PlanRollout splits a pool's rollout budget (maxSurge, maxUnavailable,
// already resolved against the pool's replicas) over its shards, given in
// the pool's shard order, so that the pool-wide bounds hold: one shard at a
// time gets the whole budget and every other shard is sent paused (the
// server keeps their members that are not up to date and creates no surge
// member for them). The shard holding the budget keeps it until it is up to
// date; then the first shard in order that is not up to date gets it.
// Shards that are up to date need no budget and are paused too (a paused
// group still scales and replaces unhealthy members). A paused pool
// (spec.strategy.paused) pauses every shard: the holder keeps its bounds
// with paused set (the server then keeps a surge member it started until it
// is ready), so resuming gives the budget back to the same shard and no
// second shard ever surges. A shard without budget is always sent with
// paused set, never with both bounds 0, which the server refuses.
func PlanRollout(shards []ShardState, maxSurge, maxUnavailable int32, paused bool) RolloutPlan {
	p := RolloutPlan{Budgets: make(map[string]infrav1.ShardRollout, len(shards))}
	holder, first := "", ""
	for _, s := range shards {
		if s.Known {
			p.UpToDate += min(s.UpToDate, s.Replicas)
		}
		if s.done() {
			continue
		}
		p.Outdated = append(p.Outdated, s.Shard)
		if first == "" {
			first = s.Shard
		}
		if s.Budget && holder == "" {
			holder = s.Shard
		}
	}
	p.Rolling = holder
	if p.Rolling == "" && !paused {
		p.Rolling = first
	}
	for _, s := range shards {
		if s.Shard == p.Rolling {
			p.Budgets[s.Shard] = infrav1.ShardRollout{MaxSurge: ptr.To(maxSurge), MaxUnavailable: maxUnavailable, Paused: paused}
			continue
		}
		p.Budgets[s.Shard] = infrav1.ShardRollout{Paused: true}
	}
	return p
}

// RolloutBounds resolves a pool's spec.strategy against its replicas as a
// MachineDeployment's rolling update does: maxSurge (default 1) as a
// number or a percentage rounded up, maxUnavailable (default 0) rounded
// down; when both come to 0, maxUnavailable is 1 so the rollout can
// proceed. It also says whether the rollout is paused.
func RolloutBounds(s *infrav1.MachinePoolStrategy, replicas int32) (maxSurge, maxUnavailable int32, paused bool, err error) {
	surge, unavail := infrav1.DefaultMaxSurge, infrav1.DefaultMaxUnavailable
	if s != nil {
		paused = s.Paused
		if ru := s.RollingUpdate; ru != nil {
			surge = ptr.Deref(ru.MaxSurge, surge)
			unavail = ptr.Deref(ru.MaxUnavailable, unavail)
		}
	}
	n := int(max(replicas, 0))
	su, err := intstr.GetScaledValueFromIntOrPercent(&surge, n, true)
	if err != nil || su < 0 {
		return 0, 0, paused, fmt.Errorf("spec.strategy.rollingUpdate.maxSurge %s: want a number >= 0 or a percentage", surge.String())
	}
	un, err := intstr.GetScaledValueFromIntOrPercent(&unavail, n, false)
	if err != nil || un < 0 {
		return 0, 0, paused, fmt.Errorf("spec.strategy.rollingUpdate.maxUnavailable %s: want a number >= 0 or a percentage", unavail.String())
	}
	if su == 0 && un == 0 {
		un = 1
	}
	return int32(min(su, 10000)), int32(min(un, 10000)), paused, nil
}

// RolloutStatus is the RollingOut condition's status, reason and message
// for plan on a pool of replicas, e.g. "3/6 up to date, shard b rolling".
func RolloutStatus(plan RolloutPlan, replicas int32, paused bool) (bool, string, string) {
	progress := fmt.Sprintf("%d/%d up to date", plan.UpToDate, replicas)
	switch {
	case !plan.RollingOut():
		return false, infrav1.NotRollingOutReason, progress
	case paused:
		return true, infrav1.RolloutPausedReason, fmt.Sprintf("%s, paused by spec.strategy.paused (shards %s not up to date)",
			progress, strings.Join(plan.Outdated, ", "))
	}
	msg := fmt.Sprintf("%s, shard %s rolling", progress, plan.Rolling)
	if waiting := without(plan.Outdated, plan.Rolling); len(waiting) > 0 {
		msg += ", then " + strings.Join(waiting, ", ")
	}
	return true, infrav1.RollingOutReason, msg
}

// Rollout Event reasons on the pool.
const (
	EventRolloutStarted   = "RolloutStarted"
	EventRolloutShardStep = "RolloutShardStep"
	EventRolloutDone      = "RolloutDone"
	EventRolloutPaused    = "RolloutPaused"
	EventRolloutResumed   = "RolloutResumed"
)

// RolloutEvent is one Event a pass of the rollout records.
type RolloutEvent struct {
	Reason, Message string
}

// RolloutEvents returns the Events for the change of a pool's rollout from
// the previous RollingOut condition (prevReason "" when it had none) and
// the shard that held the budget before (prevRolling) to the new state.
func RolloutEvents(prevReason, prevRolling string, plan RolloutPlan, reason, message string) []RolloutEvent {
	var out []RolloutEvent
	wasRolling := prevReason == infrav1.RollingOutReason || prevReason == infrav1.RolloutPausedReason
	switch {
	case !wasRolling && plan.RollingOut():
		out = append(out, RolloutEvent{EventRolloutStarted, "rollout started: " + message})
	case wasRolling && !plan.RollingOut():
		out = append(out, RolloutEvent{EventRolloutDone, "rollout done: " + message})
	}
	if plan.RollingOut() {
		switch {
		case reason == infrav1.RolloutPausedReason && prevReason != infrav1.RolloutPausedReason:
			out = append(out, RolloutEvent{EventRolloutPaused, "rollout paused: " + message})
		case reason == infrav1.RollingOutReason && prevReason == infrav1.RolloutPausedReason:
			out = append(out, RolloutEvent{EventRolloutResumed, "rollout resumed: " + message})
		}
		if plan.Rolling != "" && plan.Rolling != prevRolling {
			out = append(out, RolloutEvent{EventRolloutShardStep, "shard " + plan.Rolling + " rolls: " + message})
		}
	}
	return out
}

func without(ss []string, s string) []string {
	out := make([]string, 0, len(ss))
	for _, x := range ss {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}
