#!/usr/bin/env bash
# make clean-dev: end exactly what the dev stack started, then remove temp/.
#  1. Overmind, through its own control socket (temp/overmind.sock): `quit`
#     stops every Procfile process and Overmind's private tmux server.
#  2. The agents' tmux session (nstance-dev-agents by exact name): the
#     process trees of its panes get SIGTERM, then the session is killed.
#  3. PIDs recorded under temp/pids/ (Overmind itself, etcd/apiserver, ...),
#     each checked to be alive first.
# Nothing is looked up by process name.
# Stopping needs no dev-s3 keys; do not generate them into a DEV_DIR that is
# about to go.
DEV_S3_NO_KEYS=1
source "$(dirname "$0")/dev-common.sh"

alive() { kill -0 "$1" 2>/dev/null; }
gone() { ! alive "$1"; }
# none_alive PID...: none of the PIDs is running.
none_alive() {
	local p
	for p in "$@"; do alive "$p" && return 1; done
	return 0
}
# descendants PID: PID and all its descendants (children first).
descendants() {
	local p=$1 c
	for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do descendants "$c"; done
	echo "$p"
}
# stop_tree PID: SIGTERM a process tree, SIGKILL what is left after 5s.
stop_tree() {
	local pids p i
	pids=$(descendants "$1")
	for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
	for i in $(seq 1 50); do
		local left=0
		for p in $pids; do alive "$p" && left=1; done
		((left)) || return 0
		sleep 0.1
	done
	for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
}

sock="$DEV_DIR/overmind.sock"
started=() # every process under Overmind's panes, as `overmind status` lists them
if [[ -S $sock ]]; then
	for pid in $(overmind status -s "$sock" 2>/dev/null | awk 'NR > 1 && $2 ~ /^[0-9]+$/ && $2 > 0 { print $2 }'); do
		started+=($(descendants "$pid"))
	done
	log "stopping Overmind ($sock)"
	overmind quit -s "$sock" >/dev/null 2>&1 || true
	progress_wait "Overmind to quit (socket $sock removed)" 20 test ! -S "$sock" || log "Overmind's socket is still there; going on"
fi
# Air may exit before the binary it runs has finished shutting down: give
# the processes Overmind ran up to 20s, then end what is left.
if ((${#started[@]})); then
	progress_wait "the ${#started[@]} processes Overmind ran to exit" 20 none_alive "${started[@]}" || true
fi
for pid in "${started[@]}"; do
	if alive "$pid"; then log "pid $pid (started under Overmind) still running; terminating it"; stop_tree "$pid"; fi
done
if [[ -f $DEV_DIR/pids/overmind.pid ]]; then
	pid=$(cat "$DEV_DIR/pids/overmind.pid")
	progress_wait "Overmind (pid $pid) to exit" 10 gone "$pid" || true
	if alive "$pid"; then log "Overmind (pid $pid) did not quit; terminating it"; stop_tree "$pid"; fi
	rm -f "$DEV_DIR/pids/overmind.pid"
fi

for session in "$DEV_AGENT_SESSION"; do
	if tmux has-session -t "=$session" 2>/dev/null; then
		log "stopping tmux session $session"
		for pane in $(tmux list-panes -s -t "=$session" -F '#{pane_pid}' 2>/dev/null); do stop_tree "$pane"; done
		tmux kill-session -t "=$session" 2>/dev/null || true
	fi
done

if [[ -d $DEV_DIR/pids ]]; then
	for f in "$DEV_DIR"/pids/*.pid; do
		[[ -f $f ]] || continue
		pid=$(cat "$f")
		if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid"; then log "stopping $(basename "$f" .pid) (pid $pid)"; stop_tree "$pid"; fi
	done
fi

rm -rf "$DEV_DIR"
log "removed $DEV_DIR/"
