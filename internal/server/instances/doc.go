// Package instances keeps the server's instance records. Object storage is
// the source of truth (shard/{shard}/instances/{id}.json, written with
// conditional requests so two servers cannot overwrite each other's changes);
// the Store keeps an in-process index of every record, rebuilt from storage by
// Load when the server becomes leader, and mirrors every change into an
// optional Mirror (the server's SQLite cache).
package instances
