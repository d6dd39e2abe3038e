#!/usr/bin/env bash
# The upstream CRDs the tests install (Cluster API at its current and 1.10 releases, the in-cluster
# provider's pools, Metal3 IPAM, CAPM3, BareMetalHost), taken from the `config/crd` folders of the
# upstream Go modules at the versions pinned in hack/versions.env (and CAPM3's admission webhook
# configuration, which tests/capm3.rs registers), downloaded through the Go module
# proxy and verified against hack/upstream/go.sum. Cached under $BITPOOL_CACHE_DIR; prints the folder.
#
#   hack/upstream-crds.sh          fetch (once) and print the folder
#   hack/upstream-crds.sh --pin    print the go.sum lines of the pinned versions, for
#                                  hack/upstream/go.sum after a version change (trust on first use)
set -euo pipefail
HACK_DIR=$(cd "${0%/*}" && pwd)
# shellcheck source=hack/versions.env
. "$HACK_DIR/versions.env"
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}

die() { echo "upstream-crds: $*" >&2; exit 1; }
command -v go >/dev/null 2>&1 || die "missing prerequisite: Go on PATH (it downloads the upstream modules)"
export GOMODCACHE=$CACHE_DIR/go/mod GOFLAGS=-modcacherw GOTOOLCHAIN=local

# folder  module@version  path of the CRD folder in the module  file pattern
SOURCES="
cluster-api                 sigs.k8s.io/cluster-api@$BITPOOL_CAPI_VERSION                                   core/config/crd/bases  *
cluster-api-v1.10           sigs.k8s.io/cluster-api@$BITPOOL_CAPI_PREVIOUS_VERSION                          config/crd/bases       *
in-cluster                  sigs.k8s.io/cluster-api-ipam-provider-in-cluster@$BITPOOL_IN_CLUSTER_VERSION    config/crd/bases       *
ip-address-manager          github.com/metal3-io/ip-address-manager@$BITPOOL_METAL3_IPAM_VERSION            config/crd/bases       *
cluster-api-provider-metal3 github.com/metal3-io/cluster-api-provider-metal3@$BITPOOL_CAPM3_VERSION         config/crd/bases       *
baremetal-operator          github.com/metal3-io/baremetal-operator@$BITPOOL_BMO_VERSION                    config/base/crds/bases metal3.io_baremetalhosts.yaml
capm3-webhooks              github.com/metal3-io/cluster-api-provider-metal3@$BITPOOL_CAPM3_VERSION         config/webhook         manifests.yaml
"

# One JSON field of `go mod download -json`.
field() { sed -n "s/^[[:space:]]*\"$1\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" | head -n 1; }

if [ "${1:-}" = "--pin" ]; then
  echo "$SOURCES" | while read -r _ module _ _; do
    [ -n "$module" ] || continue
    json=$(cd "$HACK_DIR/upstream" && GONOSUMDB='*' GOFLAGS="$GOFLAGS -mod=mod" go mod download -json "$module")
    echo "${module%@*} ${module#*@} $(echo "$json" | field Sum)"
    echo "${module%@*} ${module#*@}/go.mod $(echo "$json" | field GoModSum)"
  done | sort
  exit 0
fi

key=$(echo "$SOURCES" | sha256sum | cut -c1-12)
out=$CACHE_DIR/upstream-crds/$key
if [ ! -f "$out/.complete" ]; then
  rm -rf "$out"
  echo "$SOURCES" | while read -r folder module path pattern; do
    [ -n "$folder" ] || continue
    json=$(cd "$HACK_DIR/upstream" && go mod download -json "$module" 2>&1) ||
      die "cannot download $module: $(echo "$json" | field Error)"
    dir=$(echo "$json" | field Dir)
    [ -d "$dir/$path" ] || die "$module has no $path"
    mkdir -p "$out/$folder"
    # shellcheck disable=SC2086
    (cd "$dir/$path" && cp $pattern "$out/$folder/") || die "no $pattern in $module/$path"
    chmod -R u+w "$out/$folder"
  done
  touch "$out/.complete"
fi
echo "$out"
