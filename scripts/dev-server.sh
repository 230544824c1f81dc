#!/usr/bin/env bash
# Procfile `server`: nstance-server instance N (from Overmind's PS=server#N,
# or the first argument; default 1) for shard dev-N, every port shifted by
# 10*(N-1). Uploads config/dev-N.jsonc to dev-s3 first, then runs the server
# under Air. Agents appear as windows of tmux session nstance-dev-agents.
source "$(dirname "$0")/dev-common.sh"
n=${1:-}
if [[ -z $n ]]; then
	case "${PS:-server}" in
	*#*) n=${PS##*#} ;;
	*) n=1 ;;
	esac
fi
[[ $n =~ ^[1-9][0-9]*$ ]] || die "server instance number must be 1, 2, ...; got '$n'"
shard=$(shard_of "$n")
offset=$(port_offset "$n")

wait_for "dev-s3 at $DEV_S3_ADDR" 60 http_ok "http://$DEV_S3_ADDR/healthz"
mkdir -p "$DEV_DIR/config" "$DEV_DIR/cache" "$DEV_DIR/agents" "$DEV_DIR/air/server-$n"
shard_config "$n" > "$DEV_DIR/config/$shard.jsonc"
put_object "config/$shard.jsonc" "$DEV_DIR/config/$shard.jsonc"
# The dev nodes' user data (a Go template the server renders per instance)
# and the node CA their kubelet certificates come from.
put_object "dev/node-userdata.sh" examples/dev/node-userdata.sh
node_ca
node_dir=-
[[ $DEV_FAKE_NODES == true ]] && node_dir="$DEV_DIR/dev-k8s/nodes"
log "uploaded config/$shard.jsonc; health on 127.0.0.1:$(port_of "$n" 8990)"

args=(--shard "$shard" --id "$shard-a" --port-offset "$offset"
	--cache-dir "$DEV_DIR/cache" --bucket "$DEV_BUCKET"
	--agent-state-dir "$DEV_DIR/agents" --node-dir "$node_dir" --log-format "${NSTANCE_LOG_FORMAT:-text}")
out="$DEV_DIR/air/server-$n/nstance-server"
if [[ ${NSTANCE_DEV_AIR:-true} == true ]]; then
	exec air -c scripts/air/server.toml -tmp_dir "$DEV_DIR/air/server-$n" \
		-build.cmd "go build -o $out ./cmd/nstance-server" -build.bin "$out" -build.full_bin "exec $out" -- "${args[@]}"
fi
progress_run "building $out" go build -o "$out" ./cmd/nstance-server
exec "$out" "${args[@]}"
