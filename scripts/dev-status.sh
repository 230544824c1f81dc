#!/usr/bin/env bash
# Procfile `status`: the live status page (`nstance-admin serve`) for the dev
# stack's shards on http://127.0.0.1:8980 (moved with NSTANCE_DEV_PORT_BASE, or
# set by NSTANCE_DEV_STATUS_PORT).
# Registers an admin identity "nstance-status" once (files in
# temp/status/), then serves until Overmind stops it. Every request needs the
# token in temp/status/serve.token (created on the first start, mode 0600);
# serve prints the page's URL with it then, and dev-ready.sh's summary shows it.
source "$(dirname "$0")/dev-common.sh"
dir="$DEV_DIR/status"
mkdir -p "$dir"
addr="127.0.0.1:${NSTANCE_DEV_STATUS_PORT:-$(port_of 1 8980)}"

for ((n = 1; n <= DEV_SERVERS; n++)); do
	wait_for "server $n health on 127.0.0.1:$(port_of "$n" 8990)" 900 http_ok "http://127.0.0.1:$(port_of "$n" 8990)/health"
done
need_bin nstance-admin
# register: one attempt; the shard serves Registration once it leads (which
# can be after /health answers), so wait_for retries it.
register() {
	bin/nstance-admin cluster register-operator --cluster-id "$DEV_CLUSTER_ID" --storage-bucket "$DEV_BUCKET" \
		--key-provider env --role admin --operator-id nstance-status \
		--registration-addr "127.0.0.1:$(port_of 1 8992)" --out-dir "$dir" >>"$dir/register.log" 2>&1
}
if [[ ! -s $dir/operator.crt ]]; then
	wait_for "admin identity nstance-status registered at shard $(shard_of 1) (log: $dir/register.log)" 300 register
	log "admin identity nstance-status registered ($dir)"
fi
servers=()
for ((n = 1; n <= DEV_SERVERS; n++)); do servers+=("$(shard_of "$n")=127.0.0.1:$(port_of "$n" 8993)"); done
log "status page on http://$addr/"
exec bin/nstance-admin serve --listen "$addr" --servers "$(IFS=,; echo "${servers[*]}")" \
	--ca-cert "$dir/ca.crt" --cert "$dir/operator.crt" --key "$dir/operator.key" --token-file "$dir/serve.token"
