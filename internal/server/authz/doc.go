// Package authz enforces the client role on the mTLS gRPC listeners. The TLS
// layer has already verified the client certificate against the cluster CA;
// the interceptors read the identity from that verified certificate, require
// the listener's role and cluster, and put the identity into the request
// context for handlers (IdentityFrom).
package authz
