#!/usr/bin/env bash
# scripts/release.sh: every artifact of one release, in dist/<version>/.
#   VERSION=v0.3.0 HELM=bin/helm LDFLAGS='...' scripts/release.sh
# Run by `make release VERSION=vX.Y.Z`, which passes the three variables.
#   VERSION=v0.3.0 HELM=bin/helm scripts/release.sh --provider-repository
# writes only infrastructure-nstance/<version>/ (no builds): test/clusterctl
# installs that repository with clusterctl.
#
#   bin/<program>-<os>-<arch>      the six programs, linux and darwin, amd64 and arm64
#   images/<image>-<version>.oci.tar  multi-platform (linux/amd64, linux/arm64) OCI
#                                  layouts of the four images; push with
#                                  skopeo copy --all oci-archive:FILE docker://REPO/IMAGE:VERSION
#   charts/<chart>-<version>.tgz   both Helm charts, version = appVersion = VERSION
#   infrastructure-nstance/<version>/  a clusterctl provider repository: components,
#                                  metadata.yaml, cluster templates
#   CHANGELOG.md                   the commits since the previous tag
#   SHA256SUMS                     of everything above
# Every build is -trimpath with the version stamped and no VCS stamp, and every
# image timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), so
# building the same commit twice gives the same files and image digests.
set -euo pipefail
. "$(dirname "$0")/lib/progress.sh"
only_repository=
case ${1:-} in
  '') ;;
  --provider-repository) only_repository=1 ;;
  *) echo "release: unknown argument $1 (the only one is --provider-repository)" >&2; exit 2 ;;
esac
PROGRESS_TAG=release

root=$(cd "$(dirname "$0")/.." && pwd)
version=${VERSION:?VERSION=vX.Y.Z is required}
helm=${HELM:?HELM (path of the helm binary) is required}
ldflags=${LDFLAGS:-"-s -w -X github.com/nstance-dev/nstance/internal/version.Version=$version"}
image_repo=${IMAGE_REPO:-ghcr.io/nstance-dev}
go=${GO:-go}

if ! [[ $version =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION $version is not a semantic version tag (vMAJOR.MINOR.PATCH[-PRERELEASE])" >&2
  exit 2
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
if ! awk -v M="$major" -v m="$minor" '
    /major:/ {maj=$NF} /minor:/ {if (maj==M && $NF==m) found=1}
    END {exit !found}' "$root/metadata.yaml"; then
  echo "release: metadata.yaml has no release series $major.$minor (clusterctl needs one per minor version)" >&2
  exit 2
fi

programs=(nstance-server nstance-agent nstance-operator nstance-admin dev-k8s dev-s3)
images=(nstance-server nstance-agent nstance-operator nstance-admin)
platforms=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)
out=${DIST:-$root/dist}/$version
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}

cd "$root"

# write_provider_repository writes the clusterctl provider repository of
# this release: components rendered from the chart with the release's image
# tag, the contract metadata and the cluster templates.
write_provider_repository() {
  local repo=$out/infrastructure-nstance/$version
  rm -rf "$repo"
  mkdir -p "$repo"
  deploy/clusterctl/components.sh "$helm" "$version" >"$repo/infrastructure-components.yaml"
  cp metadata.yaml "$repo/metadata.yaml"
  cp templates/cluster-template*.yaml "$repo/"
}

if [[ -n $only_repository ]]; then
  write_provider_repository
  echo "clusterctl provider repository $version in $out/infrastructure-nstance/$version"
  exit 0
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/images" "$out/charts"

for p in "${programs[@]}"; do
  for pl in "${platforms[@]}"; do
    os=${pl%/*} arch=${pl#*/}
    progress_run "build $p $os/$arch" env GOOS="$os" GOARCH="$arch" CGO_ENABLED=0 \
      "$go" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out/bin/$p-$os-$arch" "./cmd/$p"
  done
done

for i in "${images[@]}"; do
  progress_run "image $i" bash -c 'cd "$1/scripts/image" && exec "$2" run . -name "$3" -version "$4" -repo "$5" \
      -platforms "amd64=$6/bin/$3-linux-amd64,arm64=$6/bin/$3-linux-arm64" -out "$6/images/$3-$4.oci.tar"' \
    _ "$root" "$go" "$i" "$version" "$image_repo" "$out"
done

for c in nstance-operator nstance-server; do
  "$helm" package "deploy/helm/$c" --version "$version" --app-version "$version" -d "$out/charts" >/dev/null
done
# helm stamps every entry with the packaging time; SOURCE_DATE_EPOCH (the
# commit's time) makes two packagings of one commit identical.
"$go" run ./scripts/chartpack -mtime "$SOURCE_DATE_EPOCH" "$out"/charts/*.tgz

write_provider_repository

previous=$(git describe --tags --abbrev=0 "HEAD^" 2>/dev/null || true)
{
  echo "# $version"
  echo
  if [[ -n $previous ]]; then
    echo "Changes since $previous:"
    range="$previous..HEAD"
  else
    echo "Changes (first release):"
    range=HEAD
  fi
  echo
  git log --no-merges --format='- %s (%h)' "$range"
} >"$out/CHANGELOG.md"

(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release $version in $out:"
(cd "$out" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)
