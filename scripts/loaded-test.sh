#!/usr/bin/env bash
# Runs `make test` several times in a row while other processes keep every
# core busy, the way a loaded CI machine behaves. Flaky is broken: one failed
# run out of N is a failure of this script.
#
#   scripts/loaded-test.sh [runs]      (default 5; NSTANCE_LOAD_PROCS=<n> hogs, default: one per core)
#
# Prints one line per run (exit status and wall time) and keeps each run's
# output in temp/loaded-test/run-<i>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
procs=${NSTANCE_LOAD_PROCS:-$(getconf _NPROCESSORS_ONLN)}
logs=temp/loaded-test
mkdir -p "$logs"

hogs=()
stop_hogs() {
	# Only the PIDs started here.
	for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for _ in $(seq "$procs"); do
	# A busy loop in a subshell; its output goes nowhere.
	( while :; do :; done ) &
	hogs+=("$!")
done
echo "loaded-test: $procs CPU hogs running (PIDs ${hogs[*]}); $runs runs of make test"

failed=0
for i in $(seq "$runs"); do
	start=$(date +%s)
	status=0
	make test >"$logs/run-$i.log" 2>&1 || status=$?
	took=$(( $(date +%s) - start ))
	if [ "$status" -eq 0 ]; then
		echo "loaded-test: run $i/$runs passed in ${took}s"
	else
		failed=$((failed + 1))
		echo "loaded-test: run $i/$runs FAILED (exit $status) in ${took}s; failures:"
		grep -E '^(--- FAIL|FAIL|panic:)' "$logs/run-$i.log" | head -n 20 || true
	fi
done
echo "loaded-test: $((runs - failed))/$runs runs passed"
[ "$failed" -eq 0 ]
