// Package election elects one leader per lease object (cluster/leader.json,
// shard/{shard}/leader.json) using only conditional object-storage writes.
//
// The lease is JSON {holder, incarnation, renewed_at, expires_at, term}. A candidate creates
// a missing lease with If-None-Match, and replaces an existing one with
// If-Match on the etag it read, so of two racing candidates exactly one wins.
// The holder renews every RenewInterval; a renewal refused with "precondition
// failed" means someone else holds the lease now, and the holder steps down at
// once. A candidate takes over an existing lease only when it looks dead:
// released (empty holder), or its etag has not changed for LeaseDuration plus
// MaxClockSkew as measured by the candidate's own clock, or its stored expiry
// is more than MaxClockSkew in the past.
//
// The holder acts only until RenewDeadline (strictly shorter than the lease)
// after the start of its last successful renewal: then Status and Check report
// it as not leading, whatever its renewal loop is doing (a renewal write that
// blocks, a process resumed after SIGSTOP), OnLeading's context is cancelled,
// and renewal writes are bounded by that deadline. Callers fence every
// state-changing write and provider call with Check and Bound. An unparsable
// lease is an error, never a release. The etag of the last successful write is
// the fencing token in storage.
//
// The holder is the server id; the incarnation is random per process. Only a
// lease with this candidate's id and incarnation is its own. A lease under its
// id but another incarnation is treated like anyone else's (a crashed previous
// run leaves it unchanged and it is taken over after a lease); if it is seen
// being renewed, another live process uses the same id, and Run returns
// ErrDuplicateID instead of campaigning.
package election
