// Package layout is the single place that names every object-storage key
// nstance-server and nstance-admin read or write.
//
//	cluster/ca.crt                      cluster CA certificate, plain PEM
//	cluster/secret/ca.key               CA private key, encrypted envelope
//	cluster/secret/nonce-signing.key    Ed25519 nonce-signing key, encrypted envelope
//	cluster/ca-bundle.crt               every trusted cluster CA (two while rotating), plain PEM
//	cluster/ca-rotation.json            cluster CA rotation state (phase, fingerprints, gates)
//	cluster/ca-next.crt                 incoming CA during a rotation (introduce -> switch), plain PEM
//	cluster/secret/ca-next.key          its private key, encrypted envelope
//	cluster/ca-previous.crt             outgoing CA during a rotation (switch -> retire), plain PEM
//	cluster/tenants/{tenant}/workload-ca.crt         a tenant's workload CA certificate (its template certificates), plain PEM
//	cluster/secret/tenants/{tenant}/workload-ca.key  a tenant's workload CA private key, encrypted envelope
//	cluster/workload-ca.crt             shared workload CA of a cluster from before per-tenant CAs (signs nothing), plain PEM
//	cluster/secret/workload-ca.key      its private key, encrypted envelope
//	cluster/workload-ca-transition.json until when the shared workload CA stays in the tenants' bundles
//	cluster/cas/{name}.crt              CA imported by the admin (e.g. a workload cluster's), plain PEM
//	cluster/secret/cas/{name}.key       its private key, encrypted envelope
//	cluster/secret/userdata/{shard}/{tenant}/{sha256}  bootstrap data tenants sent, encrypted envelope
//	cluster/leader.json                 cluster leader lease
//	cluster/operators/{id}.json         operator registrations
//	cluster/revocations/{id}.json       revoked operator/admin identities and serials (every shard)
//	config/{shard}.jsonc                shard server configuration (JSONC)
//	groups/{shard}.jsonc                dynamic groups written through the Operator API
//	shard/{shard}/leader.json           shard leader lease
//	shard/{shard}/instances/{id}.json   instance records
//	shard/{shard}/nonces/{jti}          used-nonce markers, created with If-None-Match
//	shard/{shard}/revocations/{id}.json revoked agent identities of the shard's instances
//	cluster/nonces/{jti}                used operator-nonce markers (operator nonces are cluster-wide)
//	cluster/secret/files/{name}         file secrets for template files of kind secret, encrypted envelope
//	                                    (AAD = the object key), written by nstance-admin cluster secret
//	anything else                       free for template files of kind storage (CheckTemplateObject
//	                                    refuses cluster/, shard/, config/ and groups/)
//
// Every key may be placed under a common prefix (Keys.Prefix) so several
// clusters can share a bucket.
//
// layout is a shared leaf package (docs/architecture.md, "Import rule";
// checked by test/imports): the server, nstance-admin, nonce and carotation
// import it, and it imports no component package.
package layout
