// Package clusterctl holds only a test: the path from a release onto a
// management cluster, as README.md's "Install on a cluster" (clusterctl)
// describes it, run with the real programs.
//
// Real: kube-apiserver and etcd (the envtest binaries, started bare: no CRD
// is installed before clusterctl installs them); clusterctl, built from the
// sigs.k8s.io/cluster-api module of go.mod by `make bin/clusterctl`
// (scripts/tools/clusterctl); kubectl (the envtest one); a local clusterctl
// repository holding core Cluster API and the kubeadm bootstrap and control
// plane providers (kubectl kustomize of their config/default in the module
// cache, with the module's metadata.yaml) and the Nstance provider repository
// exactly as `make release` writes it (scripts/release.sh
// --provider-repository); `clusterctl init --infrastructure nstance` and
// `clusterctl generate cluster ... | kubectl apply -f -` with the environment
// the README documents; core Cluster API's own controllers and admission
// webhooks (from the module, in-process, as internal/operator/capicontract
// runs them) and the Nstance operator (internal/operator/manager, in-process,
// configured from the ConfigMap and Deployment clusterctl installed, and
// authenticated as the ServiceAccount of the components, so their RBAC is
// what it gets); a shard (internal/server/shardtest) and a registration
// server with a real nonce.
//
// Not real: no pod runs (there is no kubelet): the controllers and webhook
// servers of the installed Deployments run in the test process instead, and
// the installed webhook configurations are pointed at them (URL and CA
// bundle, as envtest does) in place of the Services and cert-manager's CA
// injection. Core Cluster API runs as the cluster administrator, not as its
// ServiceAccount: its ClusterRole is an aggregated one, which only
// kube-controller-manager (not running) fills. cert-manager is only its API
// (testdata/cert-manager-api.yaml: Issuer and Certificate, which is all
// clusterctl checks before it skips installing cert-manager); no certificate
// is issued. The kubeadm providers are installed (clusterctl init adds them
// on a first run) but none of their controllers runs: the Nstance templates
// use none of their kinds. Nodes are registered by the shard's provider as
// the dev stack does, in the same API server, which also serves as the
// workload cluster.
//
// The Cluster reaches what a user checks: v1beta2 Available, with its
// infrastructure provisioned, its control plane initialized and available,
// the remote connection probe passing and the MachinePool's workers Ready.
package clusterctl
