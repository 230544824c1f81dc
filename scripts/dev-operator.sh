#!/usr/bin/env bash
# nstance-operator for the dev stack.
#
#   scripts/dev-operator.sh           Procfile `operator` (make dev-tmux-k8s):
#                                     prepares dev-k8s, then runs the operator.
#   scripts/dev-operator.sh external  make dev-operator / dev-tmux-apiserver:
#                                     a real cluster reached through
#                                     temp/operator/kubeconfig (kind, envtest
#                                     apiserver); objects created with kubectl.
#
# Flow: wait for every server's /health and for the Kubernetes API, publish
# the cluster CA (temp/dev-s3/cluster/ca.crt) as ConfigMap nstance-cluster-ca,
# mint a registration nonce with `nstance-admin cluster nonce` into Secret
# nstance-operator-nonce (unless one exists or the operator is registered),
# write temp/operator/config.yaml with every shard's endpoints, then run the
# operator under Air with NSTANCE_K8S_JSON=true.
source "$(dirname "$0")/dev-common.sh"
mode=${1:-dev-k8s}
[[ ${NSTANCE_DEV_K8S:-dev-k8s} == apiserver ]] && mode=external
# The envtest kubectl (v1.36) when available.
[[ -n ${KUBEBUILDER_ASSETS:-} && -x ${KUBEBUILDER_ASSETS}/kubectl ]] && export PATH="$KUBEBUILDER_ASSETS:$PATH"
op_dir="$DEV_DIR/operator"
export KUBECONFIG="$DEV_DIR_ABS/operator/kubeconfig"
mkdir -p "$op_dir"

for ((n = 1; n <= DEV_SERVERS; n++)); do
	wait_for "server $n health on 127.0.0.1:$(port_of "$n" 8990)" 300 http_ok "http://127.0.0.1:$(port_of "$n" 8990)/health"
done
if [[ $mode == dev-k8s ]]; then
	wait_for "dev-k8s on $DEV_K8S_ADDR" 120 https_ok "https://$DEV_K8S_ADDR/version"
	k8s_dir="$DEV_DIR/dev-k8s"
else
	if [[ ${NSTANCE_DEV_K8S:-} == apiserver ]]; then
		wait_for "kube-apiserver kubeconfig ($op_dir/kubeconfig)" 180 test -s "$KUBECONFIG"
	fi
	[[ -f $KUBECONFIG ]] || die "$op_dir/kubeconfig is missing: write your cluster's kubeconfig there (e.g. kind get kubeconfig --name nstance-dev > $op_dir/kubeconfig)"
	command -v kubectl >/dev/null || die "kubectl is required for an external cluster"
	wait_for "Kubernetes API (kubectl version)" 120 kubectl version --request-timeout=2s
fi
ca="$DEV_DIR/dev-s3/cluster/ca.crt"
wait_for "cluster CA at $ca" 120 test -s "$ca"

# put_json RESOURCE NAME JSON: create or replace a namespaced object.
put_json() {
	if [[ $mode == dev-k8s ]]; then
		local dir="$k8s_dir/$1/$DEV_NAMESPACE"
		mkdir -p "$dir"
		printf '%s\n' "$3" > "$dir/.$2.json.tmp" && mv "$dir/.$2.json.tmp" "$dir/$2.json"
	else
		printf '%s\n' "$3" | kubectl apply -f - >/dev/null
	fi
}
has_secret() {
	if [[ $mode == dev-k8s ]]; then [[ -s $k8s_dir/secrets/$DEV_NAMESPACE/$1.json ]]
	else kubectl -n "$DEV_NAMESPACE" get secret "$1" >/dev/null 2>&1; fi
}
json_str() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))' 2>/dev/null || { printf '"'; sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | awk '{printf "%s\\n", $0}'; printf '"'; }; }

put_json configmaps nstance-cluster-ca "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"nstance-cluster-ca\",\"namespace\":\"$DEV_NAMESPACE\"},\"data\":{\"ca.crt\":$(json_str < "$ca")}}"
log "ConfigMap nstance-cluster-ca written"

if has_secret nstance-operator-cert; then
	log "operator already registered (Secret nstance-operator-cert exists); no new nonce"
elif has_secret nstance-operator-nonce && [[ ${NSTANCE_DEV_NEW_NONCE:-false} != true ]]; then
	log "Secret nstance-operator-nonce exists; keeping it (NSTANCE_DEV_NEW_NONCE=true mints another)"
else
	need_bin nstance-admin
	nonce=$(bin/nstance-admin cluster nonce --cluster-id "$DEV_CLUSTER_ID" --storage-bucket "$DEV_BUCKET" \
		--key-provider env --expiry "${NSTANCE_DEV_NONCE_EXPIRY:-24h}" --output -) || die "nstance-admin cluster nonce failed"
	[[ -n $nonce ]] || die "nstance-admin cluster nonce printed nothing"
	put_json secrets nstance-operator-nonce "{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"metadata\":{\"name\":\"nstance-operator-nonce\",\"namespace\":\"$DEV_NAMESPACE\"},\"type\":\"Opaque\",\"data\":{\"nonce.jwt\":\"$(printf '%s' "$nonce" | base64 | tr -d '\n')\"}}"
	log "Secret nstance-operator-nonce written"
fi

# The Cluster is the user's (the operator creates none and imports the
# shards' groups only into it); the dev stack declares it as the templates
# would, once: an edited or deleted one is left as the user has it.
if [[ $mode == dev-k8s ]] && [[ ! -e $k8s_dir/clusters/$DEV_NAMESPACE/$DEV_CLUSTER_ID.json ]]; then
	put_json nstanceclusters "$DEV_CLUSTER_ID" "{\"apiVersion\":\"infrastructure.cluster.x-k8s.io/v1beta1\",\"kind\":\"NstanceCluster\",\"metadata\":{\"name\":\"$DEV_CLUSTER_ID\",\"namespace\":\"$DEV_NAMESPACE\",\"labels\":{\"cluster.x-k8s.io/cluster-name\":\"$DEV_CLUSTER_ID\"}},\"spec\":{}}"
	put_json clusters "$DEV_CLUSTER_ID" "{\"apiVersion\":\"cluster.x-k8s.io/v1beta2\",\"kind\":\"Cluster\",\"metadata\":{\"name\":\"$DEV_CLUSTER_ID\",\"namespace\":\"$DEV_NAMESPACE\"},\"spec\":{\"infrastructureRef\":{\"apiGroup\":\"infrastructure.cluster.x-k8s.io\",\"kind\":\"NstanceCluster\",\"name\":\"$DEV_CLUSTER_ID\"}}}"
	log "Cluster $DEV_CLUSTER_ID declared (examples/dev-k8s/cluster.json)"
fi

{
	echo "# Generated by scripts/dev-operator.sh: one entry per dev-tmux server."
	echo "cluster_id: $DEV_CLUSTER_ID"
	echo "tenant: $DEV_TENANT"
	echo "shards:"
	for ((n = 1; n <= DEV_SERVERS; n++)); do
		echo "  $(shard_of "$n"):"
		echo "    registration_addr: \"127.0.0.1:$(port_of "$n" 8992)\""
		echo "    operator_addr: \"127.0.0.1:$(port_of "$n" 8993)\""
	done
} > "$op_dir/config.yaml"
log "wrote $op_dir/config.yaml"

export NSTANCE_NAMESPACE="$DEV_NAMESPACE" NSTANCE_K8S_JSON=true
# Webhooks need a serving certificate and an API server that calls back; the
# dev stack runs without them, as the seed suggests for development.
args=(--config "$op_dir/config.yaml" --kubeconfig "$KUBECONFIG" --health-probe-bind-address "127.0.0.1:${NSTANCE_DEV_OPERATOR_PROBE_PORT:-8081}" --disable-webhooks --log-format "${NSTANCE_LOG_FORMAT:-text}")
out="$DEV_DIR/air/operator/nstance-operator"
mkdir -p "$DEV_DIR/air/operator"
if [[ ${NSTANCE_DEV_AIR:-true} == true ]]; then
	exec air -c scripts/air/operator.toml -tmp_dir "$DEV_DIR/air/operator" \
		-build.cmd "go build -o $out ./cmd/nstance-operator" -build.bin "$out" -build.full_bin "exec $out" -- "${args[@]}"
fi
progress_run "building $out" go build -o "$out" ./cmd/nstance-operator
exec "$out" "${args[@]}"
