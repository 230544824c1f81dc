#!/usr/bin/env bash
# Runs every native Go fuzz target (func FuzzXxx(f *testing.F) in a
# *_test.go file) one after another and prints, for each, its wall time and
# its CPU time (user+sys of the fuzzing process and its workers).
#
#   FUZZTIME          how long one run of a target fuzzes (go's -fuzztime; default 1m)
#   FUZZ_CPU_MINUTES  when set, targets run in rounds (each one FUZZTIME per
#                     round) until each one's cumulative CPU time reaches this
#                     many minutes; the corpus Go keeps in GOCACHE/fuzz carries
#                     over
#   FUZZ_PARALLEL     fuzzing workers per target (go's -parallel; default 2)
#   FUZZ_TARGETS      extended regexp selecting targets by "<package dir>.<FuzzName>"
#
# Each package's fuzz test binary is built first (its build time is not
# counted) and run in the package directory, so a crashing input lands in
# <package>/testdata/fuzz/<FuzzName>/ as with `go test -fuzz`. The script
# fails when any target crashes (naming the target and that file) or cannot
# be built or run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-1m}
FUZZ_CPU_MINUTES=${FUZZ_CPU_MINUTES:-}
FUZZ_PARALLEL=${FUZZ_PARALLEL:-2}
FUZZ_TARGETS=${FUZZ_TARGETS:-}

if [[ -n $FUZZ_CPU_MINUTES && ! $FUZZ_CPU_MINUTES =~ ^[0-9]+([.][0-9]+)?$ ]]; then
	echo "fuzz: FUZZ_CPU_MINUTES must be a number of minutes, got '$FUZZ_CPU_MINUTES'" >&2
	exit 2
fi
if [[ -z ${EPOCHREALTIME:-} ]]; then
	echo "fuzz: bash 5 or later is needed (EPOCHREALTIME)" >&2
	exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# children_cpu sets CHILDREN_CPU_MS to the CPU time (user+sys, ms) of every
# child this shell has waited for, from the `times` builtin. It must run in
# this shell, never in $(...): a subshell's counters start at zero.
children_cpu() {
	local line u s
	times >"$work/times"
	line=$(tail -n 1 "$work/times") # children: "<m>m<s>.<ms>s <m>m<s>.<ms>s"
	u=${line%% *}
	s=${line##* }
	CHILDREN_CPU_MS=$(($(to_ms "$u") + $(to_ms "$s")))
}

# to_ms converts bash's "1m2.345s" to milliseconds.
to_ms() {
	local v=$1 m sec
	m=${v%%m*}
	sec=${v#*m}
	sec=${sec%s}
	local whole=${sec%%.*} frac=${sec#*.}
	frac=${frac}000
	echo $((10#$m * 60000 + 10#$whole * 1000 + 10#${frac:0:3}))
}

now_ms() {
	local t=${EPOCHREALTIME/,/.}
	local whole=${t%%.*} frac=${t#*.}000
	echo $((10#$whole * 1000 + 10#${frac:0:3}))
}

fmt_s() { printf '%d.%01d' $(($1 / 1000)) $((($1 % 1000) / 100)); }

# Targets as "<package dir> <FuzzName>", sorted.
# (captured first: a process substitution would lose a failure's status)
found=$(
	git ls-files --cached --others --exclude-standard -- '*_test.go' |
		grep -v '^scripts/' |
		xargs grep -HoE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' |
		sed -E 's#^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*#\1 \2#' |
		sort -u
)
mapfile -t targets <<<"$found"
selected=()
for t in "${targets[@]}"; do
	if [[ -z $FUZZ_TARGETS ]] || [[ "${t% *}.${t#* }" =~ $FUZZ_TARGETS ]]; then
		selected+=("$t")
	fi
done
if [[ ${#selected[@]} -eq 0 ]]; then
	sel=${FUZZ_TARGETS:+ match FUZZ_TARGETS=\"$FUZZ_TARGETS\"}
	echo "fuzz: no fuzz targets$sel" >&2
	exit 2
fi

cache=$($GO env GOCACHE)/fuzz
goal_ms=0
if [[ -n $FUZZ_CPU_MINUTES ]]; then
	goal_ms=$(awk -v m="$FUZZ_CPU_MINUTES" 'BEGIN { printf "%d", m * 60000 }')
fi
echo "fuzz: ${#selected[@]} targets, FUZZTIME=$FUZZTIME per run, -parallel $FUZZ_PARALLEL${FUZZ_CPU_MINUTES:+, until $FUZZ_CPU_MINUTES CPU-minutes each}"

failed=()
names=() dirs=() pkgs=() bins=() cpu_total=() wall_total=() runs=() outcome=()
for t in "${selected[@]}"; do
	dir=${t% *}
	name=${t#* }
	pkg=$(cd "$dir" && $GO list -f '{{.ImportPath}}' .)
	bin="$work/$(echo "$dir" | tr / _).test"
	state=running
	if [[ ! -x $bin ]]; then
		echo "fuzz: building $pkg"
		if ! $GO test -c -fuzz "^$name\$" -o "$bin" "./$dir"; then
			failed+=("$name ($dir): build failed")
			state="build failed"
		fi
	fi
	names+=("$name") dirs+=("$dir") pkgs+=("$pkg") bins+=("$bin")
	cpu_total+=(0) wall_total+=(0) runs+=(0) outcome+=("$state")
done

# run_once i fuzzes target i for FUZZTIME and adds its wall and CPU time.
run_once() {
	local i=$1 name=${names[$1]} dir=${dirs[$1]} rc=0 cpu0 wall0 cpu wall log last crash
	runs[i]=$((runs[i] + 1))
	log="$work/$name.${runs[i]}.log"
	children_cpu
	cpu0=$CHILDREN_CPU_MS
	wall0=$(now_ms)
	(cd "$dir" && "${bins[i]}" -test.run '^$' -test.fuzz "^$name\$" -test.fuzztime "$FUZZTIME" \
		-test.parallel "$FUZZ_PARALLEL" -test.fuzzcachedir "$cache/${pkgs[i]}") >"$log" 2>&1 || rc=$?
	children_cpu
	cpu=$((CHILDREN_CPU_MS - cpu0))
	wall=$(($(now_ms) - wall0))
	cpu_total[i]=$((cpu_total[i] + cpu))
	wall_total[i]=$((wall_total[i] + wall))
	last=$(grep -E '^fuzz: elapsed' "$log" | tail -n 1 || true)
	echo "fuzz: $name ($dir) run ${runs[i]}: wall $(fmt_s "$wall")s cpu $(fmt_s "$cpu")s" \
		"(total cpu $(fmt_s "${cpu_total[i]}")s = $(cpu_min "${cpu_total[i]}") CPU-min) ${last#fuzz: }"
	if [[ $rc -ne 0 ]]; then
		cat "$log"
		crash=$(grep -oE 'testdata/fuzz/[^ ]+' "$log" | grep "/$name/" | tail -n 1 || true)
		if [[ -n $crash ]]; then
			outcome[i]="CRASH $dir/$crash"
			failed+=("$name ($dir): crashed; input written to $dir/$crash (go test -run '$name/${crash##*/}' ./$dir reproduces it)")
		else
			outcome[i]="FAILED (exit $rc)"
			failed+=("$name ($dir): exited $rc without a crash file (see the output above)")
		fi
	elif [[ $goal_ms -eq 0 || ${cpu_total[i]} -ge $goal_ms ]]; then
		outcome[i]=ok
	fi
}

cpu_min() { awk -v ms="$1" 'BEGIN { printf "%.2f", ms / 60000 }'; }

# Rounds: each target still short of its CPU goal runs once per round, so
# an interrupted campaign has spread its time over every target.
while :; do
	active=0
	for i in "${!names[@]}"; do
		if [[ ${outcome[i]} == running ]]; then
			run_once "$i"
			if [[ ${outcome[i]} == running ]]; then
				active=1
			fi
		fi
	done
	if [[ $active -eq 0 ]]; then
		break
	fi
done

summary=()
for i in "${!names[@]}"; do
	summary+=("$(printf '%-22s %-30s runs %3d  wall %8ss  cpu %8ss = %6s CPU-min  %s' "${names[i]}" "${dirs[i]}" \
		"${runs[i]}" "$(fmt_s "${wall_total[i]}")" "$(fmt_s "${cpu_total[i]}")" "$(cpu_min "${cpu_total[i]}")" "${outcome[i]}")")
done

echo
echo "fuzz: summary"
printf '  %s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
	echo
	echo "fuzz: FAILED"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "fuzz: every target ran without a crash"
