// Package register performs the agent's one-time registration: it sends the
// nonce from the identity directory with the agent's Ed25519 public key to the
// Registration service over TLS (server verified against the cluster CA),
// stores the returned certificate and CA chain, and then deletes the nonce.
// Transient failures are retried with backoff; a refused nonce is final.
package register
