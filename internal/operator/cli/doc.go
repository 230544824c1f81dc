// Package cli is the nstance-operator command line: the flags a Cluster API
// provider is expected to have (--kubeconfig, --namespace, --webhook-port,
// --webhook-cert-dir, --leader-elect, ...), each also read from an NSTANCE_*
// environment variable, the shared --log-level/--log-format, --version, a
// --help that lists every environment variable the operator reads, and
// Main, which turns them into a running manager.
package cli
