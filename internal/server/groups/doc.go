// Package groups holds the groups of one shard, per tenant: static groups
// come from the server config (groups.{tenant}.{group}) and cannot be changed
// through the API; dynamic groups are written by UpsertGroup into one
// document per tenant, groups/{shard}/{tenant}.jsonc, with conditional
// requests, so a tenant's writes never carry another tenant's groups (the
// shared groups/{shard}.jsonc of earlier versions is still read for tenants
// without their own document). It also computes the
// effective settings of an instance from config defaults, its template, its
// group and per-request overrides.
package groups
