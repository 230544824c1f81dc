// Package reconcile converges every group of a shard to its size and carries
// instances through their lifecycle:
//
//	pending -> creating/running -> pending_deletion -> deleting -> (record removed)
//
// Work is keyed by group or instance in a coalescing rate-limited queue: a key
// added while queued is merged, a key added while being processed runs again
// afterwards, and a failed key is retried with exponential backoff, so work is
// never dropped. Keys are added on group changes (API, config refresh),
// instance changes, and by a periodic pass that compares the provider's
// instance list with the records. Instance creation obeys the shard's create
// rate limit (a limited key is re-queued for when a token is due).
//
// Deletion: an instance chosen for removal (scale-down, DeleteInstance,
// expiry, group deletion, or a stopped workload) becomes pending_deletion with
// a drain deadline (its drain timeout, else the shard's default) and is
// announced on WatchInstances; it is deleted at the provider once the drain
// is acknowledged or the deadline passes, and a deleted event follows.
// DeleteInstance with on_scale_down (MarkForScaleDown) deletes nothing: it
// marks a member to be the first one the next scale-down removes, so a
// caller that then lowers the size shrinks the group by exactly that member.
//
// Health (when Options.Health is set, i.e. the provider runs agents): an
// instance is ready while its agent's last report is younger than
// shard.health_misses report intervals. A missed report triggers a provider
// check; health_misses missed reports (or no first report within
// shard.agent_startup_grace) mark it unhealthy. The health and surge tuning
// comes from the running shard config only (config.Shard.Tuning). Unhealthy, stopped and termination-announced (spot) members
// are replaced first: the group creates a replacement and announces the old
// one pending-deletion (reason UNHEALTHY or SPOT_TERMINATION) only once the
// ready members cover the group size again.
//
// Rotation: a member created with other infra settings (template, instance
// type, subnet pool, args) than its group now resolves to is rotated: at
// most shard.rotation_surge (default 1) extra members are created, and a drifted member is
// announced pending-deletion (reason ROTATION) only while the remaining
// ready members still cover the size. Var changes are not rotated; the
// Agent service pushes the re-rendered files instead.
//
// Expiry: an instance older than expiry.forced_age is removed regardless; one
// older than expiry.eligible_age is replaced one at a time per group, only
// while the group is at full size with every instance running. On-demand
// instances are removed after expiry.ondemand_age.
package reconcile
