#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver, etcd, kubectl) and kubemark
# (the hollow kubelet that tests and the dev stack run as nodes) from Go
# modules and caches them outside the clone. No download site is needed: only
# the Go module proxy. Prints the asset directory (for KUBEBUILDER_ASSETS) on
# stdout.
#
#   scripts/envtest-assets.sh          build if missing, print the directory
#   scripts/envtest-assets.sh --force  rebuild all four
#   scripts/envtest-assets.sh --check  exit 0 when the cache is complete, 1 when
#                                      not (says why on stderr); builds nothing
#   scripts/envtest-assets.sh --dir    print the directory only, build nothing
#
# Concurrent callers are safe: a build holds an exclusive lock on
# $cache/.lock; a second caller waits for it and then finds the cache built.
# Progress (what is built, elapsed time every NSTANCE_PROGRESS_INTERVAL
# seconds) goes to stderr. A cache holding the control plane but no (or a
# wrong) kubemark gets only kubemark built into it. kubemark needs cgo: a C
# compiler (gcc) must be installed.
set -euo pipefail

K8S_VERSION=1.36.3
ETCD_VERSION=3.6.16
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${NSTANCE_ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nstance/envtest}
case $cache in /*) ;; *) cache=$PWD/$cache ;; esac
dir="$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
mode=${1:-}
case $mode in
"" | --force | --check | --dir) ;;
*)
	echo "usage: scripts/envtest-assets.sh [--force | --check | --dir]" >&2
	exit 2
	;;
esac

# shellcheck source=lib/progress.sh
source "$root/scripts/lib/progress.sh"
PROGRESS_TAG=envtest-assets
log() { echo "envtest-assets: $*" >&2; }

if [ "$mode" = "--dir" ]; then
	echo "$dir"
	exit 0
fi

# control_plane reports whether $dir holds the three envtest binaries at the
# pinned versions; when not, $why says what is wrong. Each binary's whole
# output is captured before it is matched: piping into `grep -q` lets grep
# exit early, the binary dies of SIGPIPE and, under pipefail, a good cache
# would randomly look broken.
why=
control_plane() {
	local out b
	for b in kube-apiserver etcd kubectl; do
		[ -x "$dir/$b" ] || { why="$dir/$b is missing"; return 1; }
	done
	out=$("$dir/kube-apiserver" --version 2>&1) || { why="$dir/kube-apiserver --version failed: $out"; return 1; }
	[[ $out == *"v$K8S_VERSION"* ]] || { why="$dir/kube-apiserver reports '$out', want v$K8S_VERSION"; return 1; }
	out=$("$dir/etcd" --version 2>&1) || { why="$dir/etcd --version failed: $out"; return 1; }
	[[ $out == *"etcd Version: $ETCD_VERSION"* ]] || { why="$dir/etcd reports '${out%%$'\n'*}', want $ETCD_VERSION"; return 1; }
}

# kubemark_ok reports whether $1 (default $dir/kubemark) is kubemark at the
# pinned version; when not, $why says what is wrong.
kubemark_ok() {
	local bin=${1:-$dir/kubemark} out
	[ -x "$bin" ] || { why="$bin is missing"; return 1; }
	out=$("$bin" --version 2>&1) || { why="$bin --version failed: $out"; return 1; }
	[[ $out == *"v$K8S_VERSION"* ]] || { why="$bin reports '${out%%$'\n'*}', want v$K8S_VERSION"; return 1; }
}

# complete: the control plane, kubemark and nstance-hollow-kubelet (the dev
# stack's node, built from the same module), all at the pinned versions.
complete() { control_plane && kubemark_ok && kubemark_ok "$dir/nstance-hollow-kubelet"; }

if [ "$mode" = "--check" ]; then
	if complete; then
		log "cached and complete in $dir"
		exit 0
	fi
	log "not built: $why"
	exit 1
fi

if [ "$mode" != "--force" ] && complete; then
	log "cached in $dir"
	echo "$dir"
	exit 0
fi

# One build at a time per cache directory.
mkdir -p "$cache"
work=
lockdir=
cleanup() {
	if [ -n "$work" ]; then rm -rf "$work"; fi
	if [ -n "$lockdir" ]; then rm -rf "$lockdir"; fi
}
trap cleanup EXIT
exec 9>>"$cache/.lock"
if command -v flock >/dev/null 2>&1; then
	if ! flock -n 9; then
		progress_run "another envtest-assets.sh is building in $cache; waiting for it to finish" flock 9
	fi
else
	# No flock(1) (macOS): a lock directory holding the owner's PID; a dead
	# owner's lock is taken over.
	take_lock() {
		local owner
		while ! mkdir "$cache/.lock.d" 2>/dev/null; do
			owner=$(cat "$cache/.lock.d/pid" 2>/dev/null || true)
			if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then rm -rf "$cache/.lock.d"; continue; fi
			sleep 1
		done
		echo $$ >"$cache/.lock.d/pid"
	}
	if ! mkdir "$cache/.lock.d" 2>/dev/null; then
		progress_run "another envtest-assets.sh is building in $cache; waiting for it to finish" take_lock
	else
		echo $$ >"$cache/.lock.d/pid"
	fi
	lockdir="$cache/.lock.d"
fi
if [ "$mode" != "--force" ] && complete; then
	log "cached in $dir (built while this call waited)"
	echo "$dir"
	exit 0
fi
log "building into $dir because $why"

# Only kubemark is missing or wrong: build it alone, keep the control plane.
only_kubemark=
if [ "$mode" != "--force" ] && control_plane; then only_kubemark=1; fi

work=$(mktemp -d "$cache/.build.XXXXXX")

version_flags="-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
version_flags+=" -X k8s.io/component-base/version.gitMajor=${K8S_VERSION%%.*}"
minor=${K8S_VERSION#*.}
version_flags+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
version_flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
version_flags+=" -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"

start=$(date +%s)
# build_kubemark builds kubemark into $work/kubemark. It needs cgo (so a C
# compiler); the other three are built without.
build_kubemark() {
	local cc=${CC:-}
	if [ -z "$cc" ]; then
		for cc in gcc clang cc ""; do command -v "$cc" >/dev/null 2>&1 && break; done
	fi
	[ -n "$cc" ] && command -v "${cc%% *}" >/dev/null 2>&1 ||
		{ log "kubemark needs cgo, but no C compiler is installed${CC:+ (CC=$CC)}: install gcc (Debian: apt-get install gcc)"; return 1; }
	cd "$root/scripts/envtest/kube-apiserver"
	progress_run "building kubemark v$K8S_VERSION (hollow kubelet, k8s.io/kubernetes/cmd/kubemark with cgo, module scripts/envtest/kube-apiserver; minutes on 2 cores)" \
		env GONOSUMDB=k8s.io GOFLAGS=-mod=readonly CGO_ENABLED=1 go build -trimpath -ldflags "-s -w $version_flags" -o "$work/kubemark" \
		k8s.io/kubernetes/cmd/kubemark >&2 9>&-
	# The dev stack's node: the same packages, so mostly a link.
	progress_run "building nstance-hollow-kubelet v$K8S_VERSION (k8s.io/kubernetes/pkg/kubemark with cgo, scripts/envtest/kube-apiserver/cmd/nstance-hollow-kubelet)" \
		env GONOSUMDB=k8s.io GOFLAGS=-mod=readonly CGO_ENABLED=1 go build -trimpath -ldflags "-s -w $version_flags" -o "$work/nstance-hollow-kubelet" \
		./cmd/nstance-hollow-kubelet >&2 9>&-
}

if [ -n "$only_kubemark" ]; then
	build_kubemark
	for b in kubemark nstance-hollow-kubelet; do
		kubemark_ok "$work/$b" || { log "built $b does not report the expected version: $why"; exit 1; }
	done
	# Same file system: the renames are atomic for tests already using $dir.
	mv "$work/kubemark" "$dir/kubemark"
	mv "$work/nstance-hollow-kubelet" "$dir/nstance-hollow-kubelet"
	complete || { log "cache in $dir is not complete after building kubemark: $why"; exit 1; }
	log "built kubemark and nstance-hollow-kubelet in $(progress_elapsed $(($(date +%s) - start))) into $dir"
	echo "$dir"
	exit 0
fi

# A few k8s.io modules are missing from the checksum database; go.sum is committed.
cd "$root/scripts/envtest/kube-apiserver"
progress_run "building kube-apiserver and kubectl v$K8S_VERSION (k8s.io/kubernetes, module scripts/envtest/kube-apiserver; several minutes on 2 cores)" \
	env GONOSUMDB=k8s.io GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $version_flags" -o "$work/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl >&2 9>&-
cd "$root/scripts/envtest/etcd"
progress_run "building etcd v$ETCD_VERSION (go.etcd.io/etcd/server/v3, module scripts/envtest/etcd)" \
	env GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/etcd" go.etcd.io/etcd/server/v3 >&2 9>&-
build_kubemark
rm -rf "$dir"
mv "$work" "$dir"
work=
complete || { log "built binaries in $dir do not report the expected versions: $why"; exit 1; }
log "built in $(progress_elapsed $(($(date +%s) - start))) into $dir"
echo "$dir"
