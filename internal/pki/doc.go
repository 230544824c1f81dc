// Package pki holds the cluster certificate authority: generating and loading
// the Ed25519 CA, issuing client certificates that carry an identity
// (CN = client id, O = tenant, URI SAN spiffe://<cluster>/tenant/<tenant>/<role>/<id>),
// issuing server certificates, reading an identity back from a verified
// certificate, and building the TLS 1.3 configurations of the server listeners.
package pki
