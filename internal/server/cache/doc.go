// Package cache is the server's local SQLite cache (modernc.org/sqlite, no
// cgo). It mirrors shard objects from object storage by kind (instances,
// groups) so reads do not hit storage. The cache is never the
// source of truth: Rebuild replaces its contents from object storage, which
// the server does at start and whenever it becomes shard leader.
package cache
