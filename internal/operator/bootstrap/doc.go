// Package bootstrap gives the operator its client certificate. It reads the
// cluster CA from a ConfigMap, keeps an Ed25519 keypair in a Secret (written
// before anything else, so a crash before registration resumes with the same
// key), registers once with the first shard that answers using the nonce
// Secret, and stores the certificate Secret last. Later starts reuse the
// stored certificate and need no nonce.
package bootstrap
