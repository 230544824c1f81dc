// Package workloadca keeps one workload CA per tenant
// (cluster/tenants/{tenant}/workload-ca.crt, its key sealed at
// cluster/secret/tenants/{tenant}/workload-ca.key). A tenant's template
// certificates are signed by its CA and its instances' ca_bundle files hold
// its CA only, so one tenant can never obtain a certificate that another
// tenant's instances trust, whatever names its vars render. A tenant's CA
// is created by the shard leader the first time the tenant needs one
// (create-only; racing leaders end with one).
//
// Upgrade: a cluster created before per-tenant CAs has one shared workload
// CA (cluster/workload-ca.crt). Nothing signs with it any more; it stays in
// every tenant's bundle, so certificates it signed before the upgrade keep
// verifying, until the time recorded (create-only, by the first server that
// found it) in cluster/workload-ca-transition.json: the longest workload
// certificate validity of any shard plus a margin. Then bundles hold the
// tenant's CA alone; the shared CA's objects may be deleted.
package workloadca
