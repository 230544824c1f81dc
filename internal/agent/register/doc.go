// Package register performs the agent's one-time registration: it sends the
// nonce from the identity directory with the agent's Ed25519 public key to the
// Registration service over TLS (server verified against the cluster CA),
// stores the returned certificate and CA chain, and then deletes the nonce.
// Transient failures (unreachable, Unavailable, a lost reply) are retried
// with apimachinery's wait.Backoff, a nonce that is not valid yet within a
// clock-skew allowance; definite refusals end with ErrRefused and a message
// that says why retrying cannot help.
package register
