// Package drain coordinates node drains with the Nstance servers: it follows
// every shard's WatchInstances stream, cordons the Node of each instance
// announced for deletion, evicts its pods through the Eviction API and then
// acknowledges the drain, and cleans up the Machine or NstanceMachine of an
// instance once the server reports it deleted. Nodes, Pods and evictions are
// those of the workload cluster (package workload); while it cannot be
// reached a drain waits, never acknowledged.
//
// The package is the thin coordinator; the work is done by two helpers:
//
//   - nodedrain decides per pod what a drain does with it (small filters)
//     and evicts (one non-blocking pass, PodDisruptionBudget refusals
//     reported for the next pass);
//   - machinecleanup removes the Machine or NstanceMachine of a deleted
//     instance.
//
// Files: drain.go (the controller, its setup and the instance streams),
// state.go (what each shard announced, per instance), reconcile.go (one
// pass: pause, instance state, deadline, acknowledgement), report.go
// (Events and the Drained condition).
package drain
