# scripts/lib/progress.sh: progress output for steps that can take long.
# Sourced by scripts/*.sh, .ci/run and Makefile recipes; needs bash.
#
#   progress_run DESC CMD...
#       Runs CMD in the foreground (stdin, stdout and Ctrl+C behave as if run
#       directly). Prints "DESC", then "NAME: still running (1m20s)" every
#       NSTANCE_PROGRESS_INTERVAL seconds while CMD runs, then
#       "NAME: done in 2m05s" or "NAME: failed (exit 2) after 5s", and
#       returns CMD's status. NAME is DESC without a trailing " (details)".
#       CMD should be a program: a shell function runs with errexit ignored.
#   progress_wait DESC LIMIT CMD...
#       Retries CMD (output discarded) every half second until it succeeds.
#       Prints "waiting for DESC (limit LIMITs)", "still waiting for DESC
#       (40s of LIMITs)" every interval and "DESC: ready after 12s"; returns 1
#       with "gave up waiting for DESC after LIMITs" when LIMIT passes.
#   progress_elapsed SECONDS    prints 75 as "1m15s".
#
# Nesting: progress_run passes NSTANCE_PROGRESS_NEST (a directory) to CMD. A
# progress_run or progress_wait inside CMD, in this shell or another script,
# leaves a file named after its PID there while it runs, and the outer
# heartbeat stays quiet meanwhile: one heartbeat at a time, the innermost.
#
# Every line goes to stderr through progress_say, so stdout stays free for a
# script's result. progress_say prints "TAG: message" with TAG from
# PROGRESS_TAG (default: the script's name); redefine it after sourcing to
# match a script's own log format. NSTANCE_PROGRESS_INTERVAL (seconds,
# fractions allowed; default 20) keeps the gap between two lines under 30s;
# tests set it lower.

progress_say() { printf '%s: %s\n' "${PROGRESS_TAG:-${0##*/}}" "$*" >&2; }

progress_elapsed() {
	local s=$1
	if ((s >= 60)); then printf '%dm%02ds\n' $((s / 60)) $((s % 60)); else printf '%ds\n' "$s"; fi
}

# _progress_interval prints the heartbeat interval or fails on a bad value.
_progress_interval() {
	local v=${NSTANCE_PROGRESS_INTERVAL:-20}
	if [[ ! $v =~ ^([0-9]+([.][0-9]+)?|[.][0-9]+)$ ]] || [[ $v =~ ^[0.]+$ ]]; then
		echo "NSTANCE_PROGRESS_INTERVAL=$v: want a positive number of seconds, e.g. 20 or 0.5" >&2
		return 2
	fi
	echo "$v"
}

# _progress_now_ms: wall clock in milliseconds.
_progress_now_ms() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		local t=${EPOCHREALTIME/[.,]/}
		echo $((10#$t / 1000))
	else
		echo $(($(date +%s) * 1000))
	fi
}

# _progress_mark / _progress_unmark: announce to an enclosing progress_run
# that this step reports its own progress (see Nesting above). _progress_mark
# sets _progress_marker (not a command substitution: the file is named after
# this shell's PID, which a subshell would not have).
_progress_mark() {
	_progress_marker=
	if [[ -n ${NSTANCE_PROGRESS_NEST:-} && -d $NSTANCE_PROGRESS_NEST ]]; then
		_progress_marker=$NSTANCE_PROGRESS_NEST/$BASHPID
		: >"$_progress_marker" 2>/dev/null || _progress_marker=
	fi
}
_progress_unmark() { if [[ -n $1 ]]; then rm -f "$1"; fi; }

# _progress_inner NEST: a step inside is reporting (its process is alive).
_progress_inner() {
	local m
	for m in "$1"/*; do
		[[ -e $m ]] || continue
		kill -0 "${m##*/}" 2>/dev/null && return 0
	done
	return 1
}

# _progress_beat NAME START INTERVAL NEST: the heartbeat. Reads the pipe that
# progress_run holds open; prints a line at every read timeout (unless a
# step inside reports) and returns when the pipe closes (progress_run
# finished, or its shell died).
_progress_beat() {
	local name=$1 start=$2 interval=$3 nest=$4 line rc now msg
	while :; do
		rc=0
		read -r -t "$interval" line || rc=$?
		((rc > 128)) || return 0
		now=$(_progress_now_ms)
		msg="$name: still running ($(progress_elapsed $(((now - start) / 1000))))"
		# Checked right before printing; an inner step starting in between
		# can still see one last outer line.
		_progress_inner "$nest" && continue
		progress_say "$msg"
	done
}

progress_run() {
	local desc=$1 name interval start now rc=0 beat beat_pid marker nest
	shift
	name=${desc%% (*}
	interval=$(_progress_interval) || return 2
	# Milliseconds: whole seconds of the wall clock at both ends would report
	# a 3.04 s step as 4 s when it started late in a second.
	start=$(_progress_now_ms)
	# Marked before the first line and unmarked after the last, so the outer
	# heartbeat never falls between them.
	_progress_mark
	marker=$_progress_marker
	progress_say "$desc"
	if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 404)) && nest=$(mktemp -d "${TMPDIR:-/tmp}/progress.XXXXXX"); then
		exec {beat}> >(_progress_beat "$name" "$start" "$interval" "$nest")
		beat_pid=$!
		# CMD must not hold the heartbeat's pipe open (a daemon it starts would
		# keep the heartbeat alive).
		NSTANCE_PROGRESS_NEST=$nest "$@" {beat}>&- || rc=$?
		exec {beat}>&-
		wait "$beat_pid" 2>/dev/null || true
		rm -rf "$nest"
	else
		# bash before 4.4 (macOS's /bin/bash): no heartbeat, only start and end.
		"$@" || rc=$?
	fi
	now=$(_progress_now_ms)
	if ((rc == 0)); then
		progress_say "$name: done in $(progress_elapsed $(((now - start) / 1000)))"
	else
		progress_say "$name: failed (exit $rc) after $(progress_elapsed $(((now - start) / 1000)))"
	fi
	_progress_unmark "$marker"
	return "$rc"
}

progress_wait() {
	local desc=$1 limit=$2 interval interval_ms poll start next now marker
	shift 2
	if [[ ! $limit =~ ^[1-9][0-9]*$ ]]; then
		echo "progress_wait: limit '$limit' for $desc must be a whole number of seconds" >&2
		return 2
	fi
	interval=$(_progress_interval) || return 2
	interval_ms=$(awk -v s="$interval" 'BEGIN { printf "%d", s * 1000 }')
	poll=0.5
	((interval_ms >= 500)) || poll=$interval
	start=$(_progress_now_ms)
	next=$((start + interval_ms))
	_progress_mark
	marker=$_progress_marker
	progress_say "waiting for $desc (limit ${limit}s)"
	until "$@" >/dev/null 2>&1; do
		now=$(_progress_now_ms)
		if ((now - start >= limit * 1000)); then
			progress_say "gave up waiting for $desc after ${limit}s"
			_progress_unmark "$marker"
			return 1
		fi
		if ((now >= next)); then
			progress_say "still waiting for $desc ($(progress_elapsed $(((now - start) / 1000))) of ${limit}s)"
			next=$((now + interval_ms))
		fi
		sleep "$poll"
	done
	now=$(_progress_now_ms)
	progress_say "$desc: ready after $(progress_elapsed $(((now - start) / 1000)))"
	_progress_unmark "$marker"
}
