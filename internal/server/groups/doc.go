// Package groups holds the groups of one shard, per tenant: static groups
// come from the server config (groups.{tenant}.{group}) and cannot be changed
// through the API; dynamic groups are written by UpsertGroup into
// groups/{shard}.jsonc with conditional requests. It also computes the
// effective settings of an instance from config defaults, its template, its
// group and per-request overrides.
package groups
