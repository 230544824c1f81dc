// Package bootstrap makes sure the cluster secrets exist and loads them: the
// cluster CA (cluster/ca.crt plain, cluster/secret/ca.key encrypted) and the
// Ed25519 nonce-signing key (cluster/secret/nonce-signing.key encrypted).
// Workload CAs are per tenant, created on first use by the shard leader
// (internal/workloadca); the shared workload CA of an older cluster
// (cluster/workload-ca.crt) is no longer created nor loaded here.
// Only the cluster leader creates what is missing, always with create-only
// writes and the private key before the certificate; every other server waits
// and loads. Private keys are written only through the secrets store, never in
// plaintext.
package bootstrap
