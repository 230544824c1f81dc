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
//
// Expiry: an instance older than expiry.forced_age is removed regardless; one
// older than expiry.eligible_age is replaced one at a time per group, only
// while the group is at full size with every instance running. On-demand
// instances are removed after expiry.ondemand_age.
package reconcile
