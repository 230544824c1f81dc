// Package registration implements the Registration gRPC service (TLS without
// client certificates): a client presents a single-use nonce JWT and its
// Ed25519 public key and receives a client certificate carrying its identity
// and role. Agents are admitted by an InstanceGate against what the server
// knows about their instance (record, state, registered key, provider
// addresses, source address), and their certificate names come from the
// record. The nonce marker records the key and the certificate, so a retry
// with the same key gets the same certificate. It also holds the Issuer
// shared with the Operator service's RenewCertificate.
package registration
