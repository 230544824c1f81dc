#!/usr/bin/env bash
# Shared settings of the local dev stack; sourced by scripts/dev-*.sh.
# Everything listens on 127.0.0.1 (never "localhost": it may resolve to ::1).
set -euo pipefail

NSTANCE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$NSTANCE_ROOT"
export PATH="$NSTANCE_ROOT/bin:$PATH"

DEV_DIR="${NSTANCE_DEV_DIR:-temp}"
# DEV_DIR_ABS is DEV_DIR as an absolute path (DEV_DIR may be either).
case $DEV_DIR in /*) DEV_DIR_ABS=$DEV_DIR ;; *) DEV_DIR_ABS=$NSTANCE_ROOT/$DEV_DIR ;; esac
DEV_SERVERS="${NSTANCE_DEV_SERVERS:-2}"
# Server N's ports are NSTANCE_DEV_PORT_BASE (8990) + 0..4 + 10*(N-1).
DEV_PORT_BASE="${NSTANCE_DEV_PORT_BASE:-8990}"
DEV_S3_ADDR="${NSTANCE_DEV_S3_ADDR:-127.0.0.1:8989}"
DEV_K8S_ADDR="${NSTANCE_DEV_K8S_ADDR:-127.0.0.1:6443}"
# The dev load balancer (scripts/dev-lb.sh): HAProxy's frontend, 8988 (moved
# with NSTANCE_DEV_PORT_BASE).
DEV_LB_ADDR="${NSTANCE_DEV_LB_ADDR:-127.0.0.1:$((DEV_PORT_BASE - 2))}"
DEV_BUCKET=dev
DEV_CLUSTER_ID=example-cluster
DEV_TENANT=default
DEV_NAMESPACE=default
DEV_AGENT_SESSION="${NSTANCE_DEV_AGENT_SESSION:-nstance-dev-agents}"
DEV_CONFIG_TEMPLATE="${NSTANCE_DEV_CONFIG:-examples/config-tmux.jsonc}"
# Dev nodes: hollow kubelets started by each instance's user data, with the
# kubelet certificate Nstance issues from the imported CA "kubernetes"
# ($DEV_KUBE_DIR/node-ca.crt, trusted by the API server). With
# NSTANCE_DEV_FAKE_NODES=true the tmux provider writes fake Node files instead.
DEV_KUBE_DIR="$DEV_DIR/kube"
DEV_FAKE_NODES="${NSTANCE_DEV_FAKE_NODES:-false}"
DEV_NODE_CA_NAME=kubernetes

# Object storage settings every Nstance binary reads (pkg/objstore/s3store);
# the access keys come from dev_s3_keys below.
export AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://$DEV_S3_ADDR" AWS_S3_USE_PATH_STYLE=true
export NSTANCE_ENCRYPTION_KEY="${NSTANCE_ENCRYPTION_KEY:-thisisatest32bytekey123456789012}"
# dev-s3's access keys, in the aws CLI's credentials file format (mode 0600).
DEV_S3_CREDENTIALS="$DEV_DIR/dev-s3.credentials"

log() { printf '[%s] %s\n' "${PS:-$(basename "$0")}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# dev_s3_keys: dev-s3 requires signed requests, so that only the developer's
# own processes can read and write the dev bucket (its config runs as shell
# commands; cluster/secret/ holds the cluster's keys). The first script to
# run generates random keys into $DEV_S3_CREDENTIALS (0600; a lock makes
# the concurrent Procfile scripts agree); every script then exports them as
# AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for the binaries it starts.
dev_s3_keys() {
	local f=$DEV_S3_CREDENTIALS
	if [[ ! -s $f ]]; then
		mkdir -p "$DEV_DIR"
		(
			flock 9
			if [[ ! -s $f ]]; then
				umask 077
				printf '[default]\naws_access_key_id = dev-%s\naws_secret_access_key = %s\n' \
					"$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')" > "$f.tmp"
				mv "$f.tmp" "$f"
			fi
		) 9>"$f.lock" || die "generating dev-s3 keys into $f failed"
	fi
	chmod 600 "$f"
	AWS_ACCESS_KEY_ID=$(sed -n 's/^aws_access_key_id = //p' "$f")
	AWS_SECRET_ACCESS_KEY=$(sed -n 's/^aws_secret_access_key = //p' "$f")
	[[ -n $AWS_ACCESS_KEY_ID && -n $AWS_SECRET_ACCESS_KEY ]] ||
		die "$f has no aws_access_key_id or aws_secret_access_key line (remove it: the next start generates new keys)"
	export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
}
[[ ${DEV_S3_NO_KEYS:-} == 1 ]] || dev_s3_keys
# Long steps and waits report through scripts/lib/progress.sh, in log's format.
source "$NSTANCE_ROOT/scripts/lib/progress.sh"
progress_say() { log "$@"; }

# port_of N BASE: the port of server N (1-based) for a base port (8990..8994).
port_of() { echo $(( $2 + DEV_PORT_BASE - 8990 + 10 * ($1 - 1) )); }
# port_offset N: the --port-offset of server N.
port_offset() { echo $(( DEV_PORT_BASE - 8990 + 10 * ($1 - 1) )); }
shard_of() { echo "dev-$1"; }

# wait_for DESC SECONDS CMD...: retry CMD every 0.5s until it succeeds; says
# what it waits for, the limit and how long it has waited (progress_wait).
wait_for() {
	local desc=$1 secs=$2; shift 2
	progress_wait "$desc" "$secs" "$@" || die "timed out after ${secs}s waiting for $desc"
}
http_ok() { curl -fsS -o /dev/null --max-time 2 "$1"; }
https_ok() { curl -fsSk -o /dev/null --max-time 2 "$1"; }

# record_pid NAME PID: remembered so `make clean-dev` can end exactly it.
record_pid() { mkdir -p "$DEV_DIR/pids"; echo "$2" > "$DEV_DIR/pids/$1.pid"; }

# need_bin NAME: build ./bin/NAME unless it is present and newer than its sources.
need_bin() {
	local b=$1
	if [[ -x bin/$b ]] && [[ -z "$(find cmd/$b internal pkg api -name '*.go' -newer bin/$b -print -quit 2>/dev/null)" ]]; then
		return 0
	fi
	mkdir -p bin
	progress_run "building bin/$b" env CGO_ENABLED=0 go build -o "bin/$b" "./cmd/$b"
}

# kube_server / kube_content_type: the dev cluster's API server as the
# nodes reach it (dev-k8s speaks JSON only; kube-apiserver protobuf).
# make dev-tmux runs no API server: the nodes' user data then starts no kubelet.
kube_server() { if [[ ${NSTANCE_DEV_WITH_K8S:-true} == true ]]; then echo "https://$DEV_K8S_ADDR"; fi; }
kube_content_type() {
	if [[ ${NSTANCE_DEV_K8S:-dev-k8s} == apiserver ]]; then echo application/vnd.kubernetes.protobuf; else echo application/json; fi
}

# dev_lb_enabled: the dev stack runs HAProxy (installed; NSTANCE_DEV_LB=false
# turns it off).
dev_lb_enabled() { [[ ${NSTANCE_DEV_LB:-true} == true ]] && command -v haproxy >/dev/null; }

# shard_config N: print config/dev-N.jsonc, derived from examples/config-tmux.jsonc:
# shard id dev-N, advertised addresses 127.0.0.1:{8992,8993,8994}+10*(N-1), and
# the agent command scripts/dev-agent.sh (Air per agent) in session
# $DEV_AGENT_SESSION. Bind addresses keep the base ports: the server adds
# --port-offset itself.
shard_config() {
	local n=$1 out
	local reg op agent
	reg=$(port_of "$n" 8992); op=$(port_of "$n" 8993); agent=$(port_of "$n" 8994)
	out=$(sed -E \
		-e "s/\"id\": \"dev-1\"/\"id\": \"$(shard_of "$n")\"/" \
		-e "s|\"advertise\": \{ \"hosts\": \[\"127.0.0.1\"\] \}|\"advertise\": { \"hosts\": [\"127.0.0.1\"], \"registration_addr\": \"127.0.0.1:$reg\", \"operator_addr\": \"127.0.0.1:$op\", \"agent_addr\": \"127.0.0.1:$agent\" }|" \
		-e "s|\"options\": \{ \"session\": \"nstance-dev-agents\",|\"options\": { \"session\": \"$DEV_AGENT_SESSION\", \"command\": \"scripts/dev-agent.sh\",|" \
		-e "s|\"socket\": \"/path/to/temp/haproxy/admin.sock\"|\"socket\": \"$DEV_DIR_ABS/haproxy/admin.sock\"|" \
		-e "s|\"kube_server\": \"https://127.0.0.1:6443\"|\"kube_server\": \"$(kube_server)\"|" \
		-e "s|\"kube_ca\": \"temp/kube/server-ca.crt\"|\"kube_ca\": \"$DEV_DIR_ABS/kube/server-ca.crt\"|" \
		-e "s|\"kube_content_type\": \"application/json\"|\"kube_content_type\": \"$(kube_content_type)\"|" \
		-e "s|\"hollow_kubelet\": \"bin/nstance-hollow-kubelet\"|\"hollow_kubelet\": \"$(hollow_kubelet)\"|" \
		"$DEV_CONFIG_TEMPLATE")
	# Without HAProxy the lines marked "// dev-lb" (the load balancer and the
	# worker template's use of it) go: a missing socket would hold every drain.
	dev_lb_enabled || out=$(grep -v '// dev-lb' <<<"$out")
	for want in "\"id\": \"$(shard_of "$n")\"" "\"registration_addr\": \"127.0.0.1:$reg\"" '"command": "scripts/dev-agent.sh"' \
		"\"kube_ca\": \"$DEV_DIR_ABS/kube/server-ca.crt\"" "\"hollow_kubelet\": \"$(hollow_kubelet)\""; do
		grep -qF "$want" <<<"$out" || die "$DEV_CONFIG_TEMPLATE changed shape: could not set $want (update shard_config in scripts/dev-common.sh)"
	done
	printf '%s\n' "$out"
}

# node_ca: make sure the dev cluster's node CA exists (created once with
# `nstance-admin cluster ca create`, kept across restarts in dev-s3) and
# write its certificate to $DEV_KUBE_DIR/node-ca.crt. Servers and the API
# server both call it; a lock makes the first one create it.
node_ca() {
	wait_for "dev-s3 at $DEV_S3_ADDR" 60 http_ok "http://$DEV_S3_ADDR/healthz"
	need_bin nstance-admin
	mkdir -p "$DEV_KUBE_DIR"
	(
		flock 8
		bin/nstance-admin cluster ca create --name "$DEV_NODE_CA_NAME" --cert-out "$DEV_KUBE_DIR/node-ca.crt" \
			--bucket "$DEV_BUCKET" --key-provider env >/dev/null
	) 8>"$DEV_KUBE_DIR/node-ca.lock" || die "creating the dev node CA failed"
}

# hollow_kubelet: the path of nstance-hollow-kubelet in the envtest cache
# (built by scripts/envtest-assets.sh).
hollow_kubelet() { echo "$(scripts/envtest-assets.sh --dir)/nstance-hollow-kubelet"; }

# put_object KEY FILE: upload to the dev bucket through dev-s3, signed with
# the dev-s3 keys (passed on stdin, never in the command line; curl before 8
# does not send the payload hash, so it is given).
put_object() {
	curl -fsS -X PUT --aws-sigv4 "aws:amz:$AWS_REGION:s3" -K - \
		-H "x-amz-content-sha256: $(sha256sum "$2" | cut -d' ' -f1)" -H "Content-Type: application/octet-stream" \
		--data-binary "@$2" -o /dev/null "http://$DEV_S3_ADDR/$DEV_BUCKET/$1" \
		<<<"user = \"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY\""
}
