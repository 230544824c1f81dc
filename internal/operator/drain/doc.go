// Package drain coordinates node drains with the Nstance servers: it follows
// every shard's WatchInstances stream, cordons the Node of each instance
// announced for deletion, evicts its pods through the Eviction API and then
// acknowledges the drain, and cleans up the Machine or NstanceMachine of an
// instance once the server reports it deleted. Nodes, Pods and evictions are
// those of the workload cluster (package workload); while it cannot be
// reached a drain waits, never acknowledged.
package drain
