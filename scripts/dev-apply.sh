#!/usr/bin/env bash
# scripts/dev-apply.sh FILE...: put example objects into the dev cluster.
# With dev-k8s each object becomes the JSON file dev-k8s serves it from; when
# temp/operator/kubeconfig points elsewhere (make dev-tmux-apiserver, kind) it
# runs kubectl apply with it.
# scripts/dev-apply.sh --delete FILE... removes them again (through the API
# with kubectl when there is one, so finalizers run).
files=()
for a in "$@"; do [[ $a == --delete || $a = /* ]] && files+=("$a") || files+=("$PWD/$a"); done
set -- "${files[@]}"
source "$(dirname "$0")/dev-common.sh"
export KUBECONFIG="${KUBECONFIG:-$DEV_DIR_ABS/operator/kubeconfig}"
envtest_kubectl="$(scripts/envtest-assets.sh --dir)/kubectl"
[[ -x $envtest_kubectl ]] && PATH="${envtest_kubectl%/kubectl}:$PATH"
del=false
if [[ ${1:-} == --delete ]]; then del=true; shift; fi
(( $# )) || die "usage: scripts/dev-apply.sh [--delete] FILE..."
for f in "$@"; do
	[[ -f $f ]] || die "$f: no such file"
	if [[ -f $KUBECONFIG ]] && ! grep -q 'name: dev-k8s' "$KUBECONFIG"; then
		if $del; then kubectl delete -f "$f"; else kubectl apply -f "$f"; fi
		continue
	fi
	meta=$(python3 -c '
import json, sys
try:
    o = json.load(open(sys.argv[1])); m = o["metadata"]
    print(o["kind"], m["name"], m.get("namespace", "default"))
except Exception as e:
    sys.exit("%s: %s: %s" % (sys.argv[1], type(e).__name__, e))' "$f") ||
		die "$f: not a Kubernetes object in JSON (needs kind and metadata.name)"
	read -r kind name ns <<<"$meta"
	case $kind in
	NstanceMachinePool | NstanceMachine | NstanceCluster | NstanceShardGroup | NstanceMachineTemplate)
		res="$(tr '[:upper:]' '[:lower:]' <<<"$kind")s" ;;
	MachinePool | Machine | Cluster | Pod | Secret | ConfigMap | DaemonSet) res="$(tr '[:upper:]' '[:lower:]' <<<"$kind")s" ;;
	*) die "$f: kind $kind is not mapped here; use kubectl with $KUBECONFIG" ;;
	esac
	dir="$DEV_DIR/dev-k8s/$res/$ns"
	if $del; then
		# Through the API when possible: removing the file skips finalizers
		# (an NstanceMachine's deletes its instance, a pool's its groups).
		if [[ -f $KUBECONFIG ]] && command -v kubectl >/dev/null; then
			kubectl delete --ignore-not-found -f "$f"
		else
			rm -f "$dir/$name.json"
			log "deleted $dir/$name.json (no kubectl: finalizers skipped)"
		fi
		continue
	fi
	mkdir -p "$dir"
	cp "$f" "$dir/.$name.json.tmp" && mv "$dir/.$name.json.tmp" "$dir/$name.json"
	log "wrote $dir/$name.json"
done
