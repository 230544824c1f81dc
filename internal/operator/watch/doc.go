// Package watch runs the per-shard server streams. WatchGroups keeps a
// Cache of each shard's groups — with a full ListGroups resync every time the
// stream is (re)opened — and asks the shard group controller to reconcile
// what changed. WatchErrors turns server-side provider and config errors into
// Kubernetes Events on the matching NstanceShardGroup and pool. Streams are
// reopened with exponential backoff; one shard's trouble never stops another's.
package watch
