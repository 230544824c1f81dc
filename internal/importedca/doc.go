// Package importedca stores and loads the CAs an admin imports into a
// cluster: the third trust root (docs/certificates.md, "Trust model").
// Such a CA belongs to someone else, typically the workload Kubernetes
// cluster whose API server trusts it for kubelet client certificates, and
// Nstance only signs with it what a template names and the subject rules of
// pki.IssueImported allow. Its certificate is plain PEM at
// cluster/cas/{name}.crt, its key an encrypted envelope at
// cluster/secret/cas/{name}.key (internal/layout).
//
// importedca is a shared leaf (nstance-admin imports, the server loads): it
// imports only other leaves.
package importedca
