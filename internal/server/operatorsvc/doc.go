// Package operatorsvc is the gRPC Operator service of nstance-server: config
// status and refresh, groups, instances, drain acknowledgement and the three
// watch streams. Every call is scoped to the tenant of the caller's
// certificate (read from the request context); another tenant's groups and
// instances are invisible (NotFound), and watch streams only carry the
// caller's tenant's events. RenewCertificate re-issues an operator or admin
// certificate, only while the caller's record in cluster/operators/ exists
// with its tenant and role (OperatorRecords). The admin-only
// ListOperators, ListRevocations and Revoke read and write the revocation
// deny list (internal/server/revocation).
package operatorsvc
