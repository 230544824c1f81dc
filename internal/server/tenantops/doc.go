// Package tenantops carries out what a tenant asks of its shard through the
// Operator API: group upserts and deletions, on-demand instance creation,
// lookups, deletions, scale-down marks and drain acknowledgements. It checks
// each request against the running config and the tenant's limits (quotas,
// create rate), decodes the wire form, writes through the group registry and
// the instance store, and hands the work to the reconciler's queue; it
// decides nothing about convergence itself. Its errors (ErrNotFound,
// ErrInvalid with the field errors, ErrConflict, ErrNotPermitted, ErrQuota)
// are for the gRPC layer to map to status codes.
package tenantops
