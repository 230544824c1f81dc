// Package pki holds the two certificate authorities of a cluster and the TLS
// rules around them.
//
// The cluster CA (Ed25519, URI SAN spiffe://<cluster>) signs control-plane
// identities only: client certificates of agents, operators and admins
// (CN = client id, O = tenant, URI SAN
// spiffe://<cluster>/tenant/<tenant>/<role>/<id>) and server certificates
// (URI SAN spiffe://<cluster>/shard/<shard>/server/<server-id>). Every Nstance
// listener trusts it and nothing else.
//
// The workload CA (no URI SAN) signs the certificates instance templates ask
// for. No Nstance listener trusts it, it cannot issue control-plane
// identities, and every certificate it signs passes a WorkloadPolicy: no URI
// in the cluster's trust domain, no server name or address, explicit server
// and/or client auth usages only, never a CA.
//
// Clients of a server verify the chain and then the server identity
// (VerifyServerConnection), so a certificate of the right CA that is not a
// server certificate is refused whatever host names it carries.
package pki
