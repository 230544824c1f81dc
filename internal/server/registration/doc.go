// Package registration implements the Registration gRPC service (TLS without
// client certificates): a client presents a single-use nonce JWT and its
// Ed25519 public key and receives a client certificate carrying its identity
// and role. It also holds the Issuer shared with the Operator service's
// RenewCertificate.
package registration
