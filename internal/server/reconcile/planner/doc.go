// Package planner decides what a group needs next: how many instances to
// create and which members to delete, each with its reason. It is pure: it
// reads only its arguments (the group, its members with their last agent
// report, the time, the health and surge tuning), does no I/O, reads no
// clock and takes no lock. The reconciler gathers that state, calls
// PlanGroup and applies the plan (see package reconcile).
//
// The rules, in the order PlanGroup applies them:
//
//   - On-demand instances are not members. Members already on their way out
//     (pending_deletion, deleting) are drains in progress: they count for
//     nothing but hold back eligible expiry.
//   - A deleted group loses every active member (reason GROUP_DELETED).
//   - Forced expiry: a member older than Expiry.ForcedAge goes, whatever
//     else holds.
//   - Eligible expiry: the oldest member older than Expiry.EligibleAge goes,
//     one per group at a time, only while the group is at full size, no drain
//     is in progress and every member runs without a problem.
//   - Members are urgent (unhealthy, stopped, or announced for termination,
//     e.g. spot), drifted (created with other infra settings than the group
//     now resolves to) or fresh.
//   - Scale down: fresh and drifted members beyond the size, plus the surge a
//     rotation may use, go: drifted before fresh, and within each set those
//     not running (stopped, unhealthy, starting) first, then the newest;
//     members marked by MarkForScaleDown go before all of these.
//   - Urgent members go (reason UNHEALTHY, or SPOT_TERMINATION when the
//     platform announced the termination), oldest first, once the ready
//     fresh and drifted members cover the size; urgent members beyond the
//     size go at once.
//   - Rotation: drifted members go (reason ROTATION), oldest first, only
//     while the ready members left still cover the size less the group's
//     MaxUnavailable; none while the group is Paused (its surge is then 0).
//   - Creates: fresh members up to the size, while the active members stay
//     within size + replacements of urgent members (at most size) + surge
//     (at most the drifted count).
package planner
