// Package shardgroup reconciles NstanceShardGroups: it pushes each one to its
// shard's server with UpsertGroup, deletes the server group with DeleteGroup
// behind a finalizer, and reports the server's view in the status (replicas,
// provider IDs, last sync time, Ready/ShardReachable/ConfigValid). A shard
// that is down only marks its own shard groups and is retried with backoff.
package shardgroup
