#!/usr/bin/env bash
# Run by the tmux provider in window nstance-agent-{instanceID} (session
# nstance-dev-agents) with NSTANCE_INSTANCE_ID, NSTANCE_IDENTITY_DIR,
# NSTANCE_REGISTRATION_ADDR, NSTANCE_AGENT_ADDR, ... already set. Runs the
# agent under Air so agent code changes restart it.
source "$(dirname "$0")/dev-common.sh"
[[ -n ${NSTANCE_INSTANCE_ID:-} ]] || die "NSTANCE_INSTANCE_ID is not set (this script is started by the tmux provider)"
export NSTANCE_LOG_FORMAT="${NSTANCE_LOG_FORMAT:-text}" # readable in the tmux window
if [[ ${NSTANCE_DEV_AGENT_AIR:-true} == true ]] && command -v air >/dev/null; then
	exec air -c scripts/air/agent.toml -tmp_dir "$NSTANCE_IDENTITY_DIR/../air"
fi
need_bin nstance-agent
exec bin/nstance-agent
