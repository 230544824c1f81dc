// Package kubetest starts a real kube-apiserver and etcd (controller-runtime's
// envtest) with the Nstance and Cluster API CRDs installed, for tests that must
// run against the genuine API server rather than a fake client.
//
// The binaries come from scripts/envtest-assets.sh, which builds them from Go
// modules and caches them outside the clone; `make test` exports
// KUBEBUILDER_ASSETS. Without it, Start looks in the default cache directory and
// fails the test with instructions when nothing is there.
package kubetest
