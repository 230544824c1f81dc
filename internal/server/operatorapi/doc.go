// Package operatorapi implements the parts of the Operator gRPC service that
// belong to the server core: GetConfigStatus and RenewCertificate (only for
// operators whose record in cluster/operators/ still exists). Group and
// instance RPCs are provided by their own packages and composed by the app.
package operatorapi
