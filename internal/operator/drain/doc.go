// Package drain coordinates node drains with the Nstance servers: it follows
// every shard's WatchInstances stream, cordons the Node of each instance
// announced for deletion, evicts its pods through the Eviction API and then
// acknowledges the drain, and cleans up the Machine or NstanceMachine of an
// instance once the server reports it deleted.
package drain
