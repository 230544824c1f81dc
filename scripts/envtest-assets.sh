#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver, etcd, kubectl) from Go
# modules and caches it outside the clone. No download site is needed: only the
# Go module proxy. Prints the asset directory (for KUBEBUILDER_ASSETS) on stdout.
#
#   scripts/envtest-assets.sh          build if missing, print the directory
#   scripts/envtest-assets.sh --force  rebuild
#   scripts/envtest-assets.sh --dir    print the directory only, build nothing
set -euo pipefail

K8S_VERSION=1.36.3
ETCD_VERSION=3.6.16
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${NSTANCE_ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nstance/envtest}
dir="$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
force=${1:-}

log() { echo "envtest-assets: $*" >&2; }

if [ "$force" = "--dir" ]; then
	echo "$dir"
	exit 0
fi

# complete reports whether $dir holds the three binaries at the pinned versions.
# Each binary's whole output is captured before it is matched: piping into
# `grep -q` lets grep exit early, the binary dies of SIGPIPE and, under
# pipefail, a good cache would randomly look broken.
complete() {
	local out
	[ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ] && [ -x "$dir/kubectl" ] || return 1
	out=$("$dir/kube-apiserver" --version 2>/dev/null) || return 1
	[[ "$out" == *"v$K8S_VERSION"* ]] || return 1
	out=$("$dir/etcd" --version 2>/dev/null) || return 1
	[[ "$out" == *"$ETCD_VERSION"* ]] || return 1
}

if [ "$force" != "--force" ] && complete; then
	log "cached in $dir"
	echo "$dir"
	exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

version_flags="-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
version_flags+=" -X k8s.io/component-base/version.gitMajor=${K8S_VERSION%%.*}"
minor=${K8S_VERSION#*.}
version_flags+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
version_flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
version_flags+=" -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"

start=$(date +%s)
log "building kube-apiserver and kubectl v$K8S_VERSION (takes several minutes on 2 cores)"
(
	cd "$root/scripts/envtest/kube-apiserver"
	# A few k8s.io modules are missing from the checksum database; go.sum is committed.
	GONOSUMDB=k8s.io GOFLAGS=-mod=readonly CGO_ENABLED=0 \
		go build -trimpath -ldflags "-s -w $version_flags" -o "$work/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
)
log "building etcd v$ETCD_VERSION"
(
	cd "$root/scripts/envtest/etcd"
	GOFLAGS=-mod=readonly CGO_ENABLED=0 \
		go build -trimpath -ldflags "-s -w" -o "$work/etcd" go.etcd.io/etcd/server/v3
)
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
complete || { log "built binaries in $dir do not report the expected versions"; exit 1; }
log "built in $(( $(date +%s) - start ))s into $dir"
echo "$dir"
