#!/usr/bin/env bash
# Procfile `lb`: the dev load balancer, a real HAProxy (Debian package haproxy)
# from examples/dev/haproxy.cfg: frontend on $DEV_LB_ADDR (127.0.0.1:8988),
# backend dev-www, runtime API socket $DEV_DIR/haproxy/admin.sock, which the
# servers drive (load_balancers.dev-www of examples/config-tmux.jsonc) to add
# each worker's agent /healthz (port 8987 on its own loopback address).
# Without haproxy it says so and exits (Overmind lets `lb` die); shard_config
# then leaves the load balancer out of the servers' configs.
source "$(dirname "$0")/dev-common.sh"
if ! dev_lb_enabled; then
	if [[ ${NSTANCE_DEV_LB:-true} != true ]]; then
		log "NSTANCE_DEV_LB=$NSTANCE_DEV_LB: the dev stack runs without its load balancer"
	else
		log "haproxy not found: the dev stack runs without its load balancer (apt-get install haproxy / brew install haproxy)"
	fi
	exit 0
fi
dir="$DEV_DIR/haproxy"
mkdir -p "$dir"
rm -f "$dir/admin.sock"
sed -e "s|@SOCKET@|$DEV_DIR_ABS/haproxy/admin.sock|" -e "s|@FRONTEND@|$DEV_LB_ADDR|" examples/dev/haproxy.cfg > "$dir/haproxy.cfg"
log "HAProxy: frontend http://$DEV_LB_ADDR/healthz, runtime API $DEV_DIR_ABS/haproxy/admin.sock (echo 'show servers state dev-www' | socat - UNIX:$DEV_DIR_ABS/haproxy/admin.sock)"
record_pid haproxy $$
exec haproxy -f "$dir/haproxy.cfg" -db
