#!/usr/bin/env bash
# Procfile `k8s`: dev-k8s on https://127.0.0.1:6443 (loopback only) with the
# Nstance and Cluster API CRDs, objects as JSON files under temp/dev-k8s. It
# writes a kubeconfig with its admin token to temp/dev-k8s/kubeconfig
# (export KUBECONFIG=temp/dev-k8s/kubeconfig) and a copy for the operator to
# temp/operator/kubeconfig; requests without the token get 401.
source "$(dirname "$0")/dev-common.sh"
# Nodes authenticate with certificates from the dev node CA; their user data
# reaches the API server's serving CA at $DEV_KUBE_DIR/server-ca.crt.
node_ca
if [[ ${NSTANCE_DEV_K8S:-dev-k8s} == apiserver ]]; then
	# make dev-tmux-apiserver: a real kube-apiserver + etcd (envtest binaries)
	# instead of dev-k8s, authorizing kubelets with Node,RBAC and
	# NodeRestriction; with NSTANCE_DEV_FAKE_NODES=true the tmux provider's
	# Node files become real Nodes instead.
	mkdir -p bin "$DEV_DIR/operator"
	progress_run "building bin/dev-apiserver" go build -o bin/dev-apiserver ./scripts/tools/dev-apiserver
	fake=()
	[[ $DEV_FAKE_NODES == true ]] && fake=(--node-dir "$DEV_DIR/dev-k8s/nodes")
	rm -f "$DEV_KUBE_DIR/server-ca.crt" "$DEV_KUBE_DIR/server-url"
	# envtest's etcd data and certificates go under temp/ (TMPDIR), so
	# make clean-dev removes them even after a hard stop.
	export TMPDIR="$DEV_DIR_ABS/kube/tmp"
	mkdir -p "$TMPDIR"
	exec bin/dev-apiserver --kubeconfig-out "$DEV_DIR/operator/kubeconfig" --node-ca "$DEV_KUBE_DIR/node-ca.crt" \
		--server-ca-out "$DEV_KUBE_DIR/server-ca.crt" "${fake[@]}"
fi
rm -f "$DEV_KUBE_DIR/server-url"
ln -sfn "$DEV_DIR_ABS/dev-k8s/.dev-k8s/tls/ca.crt" "$DEV_KUBE_DIR/server-ca.crt"
need_bin dev-k8s
capi_crds="$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)/core/config/crd/bases"
[[ -d $capi_crds ]] || die "Cluster API CRDs not found at $capi_crds (run: go mod download sigs.k8s.io/cluster-api)"
mkdir -p "$DEV_DIR/dev-k8s/namespaces" "$DEV_DIR/operator"
# Namespace "default" exists in every real cluster; dev-k8s starts empty.
ns="$DEV_DIR/dev-k8s/namespaces/$DEV_NAMESPACE.json"
[[ -f $ns ]] || printf '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"}}\n' "$DEV_NAMESPACE" > "$ns"
exec bin/dev-k8s --addr "$DEV_K8S_ADDR" --dir "$DEV_DIR/dev-k8s" \
	--kubeconfig-out "$DEV_DIR/operator/kubeconfig" --client-ca-file "$DEV_KUBE_DIR/node-ca.crt" \
	--crd-dir config/crd/bases --crd-dir "$capi_crds"
