#!/usr/bin/env bash
# Renders bitpool's clusterctl release artifacts, one provider per components file:
#
#   hack/release.sh VERSION [OUT]     (OUT defaults to out/release; VERSION as v0.2.0)
#
#   OUT/ipam-bitpool/VERSION/ipam-components.yaml            the CAPI IPAM provider alone
#   OUT/ipam-bitpool-baremetal/VERSION/ipam-components.yaml  CAPI IPAM + Metal3 IPAM bundle
#   OUT/*/VERSION/metadata.yaml                              the release series (metadata.yaml)
#
# OUT is laid out as a clusterctl local repository; publishing a release uploads the same files
# as the release's assets and pushes the image (hack/image.sh) tagged VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/release.sh VERSION [OUT]}
out=${2:-out/release}
[[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  { echo "release: $version is not a version like v0.2.0" >&2; exit 1; }
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
# clusterctl refuses a version whose major.minor no release series of metadata.yaml names.
awk -v M="$major" -v m="$minor" '/major:/ {a=$NF} /minor:/ {if (a==M && $NF==m) found=1} END {exit !found}' \
  <(sed 's/^- //' metadata.yaml) ||
  { echo "release: metadata.yaml has no release series $major.$minor" >&2; exit 1; }
kustomize=$(hack/tools.sh kustomize)
for role in capi-ipam:ipam-bitpool baremetal:ipam-bitpool-baremetal; do
  dir=$out/${role#*:}/$version
  mkdir -p "$dir"
  # The image this release publishes (clusterctl's `images:` setting points elsewhere).
  "$kustomize" build "config/${role%%:*}" |
    sed "s|image: \(.*/bitpool\):v[^ ]*$|image: \1:$version|" >"$dir/ipam-components.yaml"
  cp metadata.yaml "$dir/metadata.yaml"
  echo "$dir/ipam-components.yaml"
done
# What enabling the Metal3Data reconciler adds to the bare-metal bundle's roles (applied by hand
# beside BITPOOL_CONTROLLERS=…,metal3-data: clusterctl installs only ipam-components.yaml).
addon=$out/ipam-bitpool-baremetal/$version/metal3-data-rbac.yaml
"$kustomize" build config/baremetal-metal3-data >"$addon"
echo "$addon"
