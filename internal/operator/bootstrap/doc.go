// Package bootstrap gives the operator its client certificate. It reads the
// cluster CA from a ConfigMap, keeps an Ed25519 keypair in a Secret (written
// before anything else, so a crash before registration resumes with the same
// key), registers with the first shard that answers using the nonce Secret,
// and stores the certificate Secret last. Later starts reuse the stored
// certificate and need no nonce. Transient failures (unreachable shards,
// Unavailable, a lost reply) are retried in rounds spaced by apimachinery's
// wait.Backoff, a nonce that is not valid yet within a clock-skew allowance;
// a definite refusal ends at once with a message naming the nonce Secret.
package bootstrap
