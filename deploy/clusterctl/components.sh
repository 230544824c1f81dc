#!/usr/bin/env bash
# Renders clusterctl's infrastructure-components.yaml from the Helm chart.
#   deploy/clusterctl/components.sh <helm binary> <image tag>
# Used by `make release-manifests` and by internal/packaging's tests.
set -euo pipefail
helm=${1:?usage: components.sh <helm> <image tag>}
tag=${2:?usage: components.sh <helm> <image tag>}
here=$(cd "$(dirname "$0")" && pwd)
"$helm" template nstance-operator "$here/../helm/nstance-operator" \
  --namespace nstance-system \
  --api-versions cert-manager.io/v1 \
  --values "$here/values.yaml" \
  --set-string image.tag="$tag"
