#!/usr/bin/env bash
# Procfile `ready`: waits until every process of the dev stack answers (with
# a heartbeat while Air builds the servers and the operator), then prints one
# summary: URLs, the kubeconfig, how to attach and how to stop. It exits after
# that; `make dev-tmux*` run it with Overmind's --can-die.
#
# NSTANCE_DEV_WITH_K8S=false (make dev-tmux) leaves out the Kubernetes side.
source "$(dirname "$0")/dev-common.sh"
with_k8s=${NSTANCE_DEV_WITH_K8S:-true}
k8s_mode=${NSTANCE_DEV_K8S:-dev-k8s}
probe="127.0.0.1:${NSTANCE_DEV_OPERATOR_PROBE_PORT:-8081}"
kubeconfig="$DEV_DIR_ABS/operator/kubeconfig"
sock="$DEV_DIR/overmind.sock"

# https_answers URL: the server answers HTTPS at all (401/403 included: it is
# up, it only wants a token).
https_answers() {
	local code
	code=$(curl -sk -o /dev/null --max-time 2 -w '%{http_code}' "$1") || true
	[[ $code =~ ^[1-5][0-9][0-9]$ ]]
}
# kubeconfig_server: the API server URL in $kubeconfig.
kubeconfig_server() { awk '$1 == "server:" { print $2; exit }' "$kubeconfig" 2>/dev/null || true; }

wait_for "dev-s3 on http://$DEV_S3_ADDR" 300 http_ok "http://$DEV_S3_ADDR/healthz"
for ((n = 1; n <= DEV_SERVERS; n++)); do
	# The first wait includes Air's build of nstance-server.
	wait_for "server $n (shard $(shard_of "$n")) on http://127.0.0.1:$(port_of "$n" 8990)/health" 900 \
		http_ok "http://127.0.0.1:$(port_of "$n" 8990)/health"
done
status_url="http://127.0.0.1:${NSTANCE_DEV_STATUS_PORT:-$(port_of 1 8980)}/"
status_token="$DEV_DIR/status/serve.token"
# status_ok URL: the status page answers with the token of dev-status.sh's serve.
status_ok() { [[ -s $status_token ]] && curl -fsS -o /dev/null --max-time 2 -H "Authorization: Bearer $(<"$status_token")" "$1"; }
wait_for "the status page $status_url (token $status_token)" 300 status_ok "${status_url}v1/status"
if [[ $with_k8s == true ]]; then
	if [[ $k8s_mode == apiserver ]]; then
		wait_for "kube-apiserver's kubeconfig $kubeconfig" 300 test -s "$kubeconfig"
	else
		wait_for "dev-k8s on https://$DEV_K8S_ADDR" 300 https_answers "https://$DEV_K8S_ADDR/version"
	fi
	# Includes Air's build of nstance-operator, which starts once the servers answer.
	wait_for "the operator's readiness probe http://$probe/readyz" 900 http_ok "http://$probe/readyz"
fi

took=
if [[ -f $DEV_DIR/pids/started-at ]]; then
	started=$(cat "$DEV_DIR/pids/started-at")
	[[ $started =~ ^[0-9]+$ ]] && took=" in $(progress_elapsed $(($(date +%s) - started)))"
fi
servers=()
for ((n = 1; n <= DEV_SERVERS; n++)); do servers+=("http://127.0.0.1:$(port_of "$n" 8990)/health ($(shard_of "$n"))"); done
procs="s3, server#1..server#$DEV_SERVERS, status, lb"
[[ $with_k8s == true ]] && procs+=", k8s, operator"

if dev_lb_enabled; then
	lb_line="lb          http://$DEV_LB_ADDR/healthz  (HAProxy, backend dev-www: the workers' agents; watch: echo 'show servers state dev-www' | socat - UNIX:$DEV_DIR_ABS/haproxy/admin.sock)"
else
	lb_line="lb          none (haproxy is not installed: the Debian package haproxy; or NSTANCE_DEV_LB=false)"
fi
summary=(
	""
	"===== nstance dev stack is up$took ====="
	"dev-s3      http://$DEV_S3_ADDR  bucket $DEV_BUCKET, keys in $DEV_DIR_ABS/dev-s3.credentials, e.g. AWS_SHARED_CREDENTIALS_FILE=$DEV_DIR_ABS/dev-s3.credentials aws --endpoint-url http://$DEV_S3_ADDR --region us-east-1 s3 ls s3://$DEV_BUCKET/"
	"servers     ${servers[*]}"
	"$lb_line"
	"status      $status_url  (live page: shards, leaders, groups, instances, errors; open ${status_url}?token=$(<"$status_token") once, API: Authorization: Bearer from $status_token)"
)
if [[ $with_k8s == true ]]; then
	if [[ $k8s_mode == apiserver ]]; then
		server=$(kubeconfig_server)
		assets=$(scripts/envtest-assets.sh --dir)
		summary+=("kube-api    $server (envtest kube-apiserver; its kubectl: export PATH=$assets:\$PATH)")
	else
		summary+=("dev-k8s     https://$DEV_K8S_ADDR  objects as JSON files in $DEV_DIR_ABS/dev-k8s/")
	fi
	summary+=(
		"kubeconfig  export KUBECONFIG=$kubeconfig"
		"operator    http://$probe/readyz (registered once Secret nstance-operator-cert exists)"
	)
	if [[ $DEV_FAKE_NODES == true ]]; then
		summary+=("nodes       FALLBACK: fake Node files written by the tmux provider (NSTANCE_DEV_FAKE_NODES=true); no kubelet runs")
	else
		summary+=("nodes       a hollow kubelet per instance, joined with the certificate Nstance issued (CA $DEV_KUBE_DIR/node-ca.crt): kubectl get nodes -o wide")
	fi
fi
summary+=(
	"agents      tmux attach -t $DEV_AGENT_SESSION   (one window per instance; tmux list-windows -t $DEV_AGENT_SESSION)"
	"processes   bin/overmind connect -s $sock <name>   (names: $procs)"
	"stop        Ctrl+C here stops the stack; make clean-dev stops what is left (agents too) and removes $DEV_DIR/"
	""
)
printf '%s\n' "${summary[@]}"
