// Package manager wires the operator together: a controller-runtime manager
// with Lease leader election, the leader-only sync runnable (registration,
// shard connections, watches, startup import) and the controllers.
package manager
