// Package bootstrap makes sure the cluster secrets exist and loads them: the
// cluster CA (cluster/ca.crt plain, cluster/secret/ca.key encrypted), the
// workload CA (cluster/workload-ca.crt plain, cluster/secret/workload-ca.key
// encrypted) and the Ed25519 nonce-signing key
// (cluster/secret/nonce-signing.key encrypted).
// Only the cluster leader creates what is missing, always with create-only
// writes and the private key before the certificate; every other server waits
// and loads. Private keys are written only through the secrets store, never in
// plaintext.
package bootstrap
