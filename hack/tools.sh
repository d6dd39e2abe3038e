#!/usr/bin/env bash
# Builds the upstream tools bitpool's release and tests use, from the Go module proxy with the
# machine's Go, once, into $BITPOOL_CACHE_DIR (outside the checkout), and prints the path.
#
#   hack/tools.sh clusterctl   sigs.k8s.io/cluster-api/cmd/clusterctl at $BITPOOL_CAPI_VERSION
#   hack/tools.sh kustomize    sigs.k8s.io/kustomize/kustomize/v5 at $BITPOOL_KUSTOMIZE_VERSION
#   hack/tools.sh capm3        CAPM3's manager (github.com/metal3-io/cluster-api-provider-metal3)
#                              at $BITPOOL_CAPM3_VERSION, for the tests that run bitpool beside it
#   hack/tools.sh in-cluster   the in-cluster IPAM provider's manager
#                              (sigs.k8s.io/cluster-api-ipam-provider-in-cluster) at
#                              $BITPOOL_IN_CLUSTER_VERSION, the peer of the load command (hack/load.sh)
#   hack/tools.sh capi-core    Cluster API core's manager (sigs.k8s.io/cluster-api) at
#                              $BITPOOL_CAPI_VERSION, for the tests that run the whole Metal3 stack
#   hack/tools.sh bmo          the baremetal-operator (github.com/metal3-io/baremetal-operator) at
#                              $BITPOOL_BMO_VERSION, run with --test-mode in those tests
#   hack/tools.sh metal3-ipam  Metal3's ip-address-manager (github.com/metal3-io/ip-address-manager)
#                              at $BITPOOL_METAL3_IPAM_VERSION, the Metal3-side peer of hack/load.sh
set -euo pipefail
HACK_DIR=$(cd "${0%/*}" && pwd)
# shellcheck source=hack/versions.env
. "$HACK_DIR/versions.env"
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}

die() { echo "tools: $*" >&2; exit 1; }

go_env() {
  command -v go >/dev/null 2>&1 || die "Go is needed to build $1 (see README: prerequisites)"
  export GOMODCACHE=$CACHE_DIR/go/mod GOCACHE=$CACHE_DIR/go/build GOFLAGS=-modcacherw GOTOOLCHAIN=local
}

# clusterctl lives in the cluster-api module, which takes its api module by a local replace:
# a scratch module pins that api module to the same release.
build_clusterctl() {
  local out=$1 work=$CACHE_DIR/build/clusterctl minor
  minor=$(echo "$BITPOOL_CAPI_VERSION" | cut -d. -f2)
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  go mod init bitpool.test/clusterctl >/dev/null 2>&1
  go mod edit -require "sigs.k8s.io/cluster-api@$BITPOOL_CAPI_VERSION" \
    -replace "sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@$BITPOOL_CAPI_VERSION"
  echo "tools: building clusterctl $BITPOOL_CAPI_VERSION (a few minutes, once)" >&2
  { go get "sigs.k8s.io/cluster-api/cmd/clusterctl@$BITPOOL_CAPI_VERSION" &&
    go build -trimpath -o "$out" -ldflags "-s -w \
      -X sigs.k8s.io/cluster-api/version.gitVersion=$BITPOOL_CAPI_VERSION \
      -X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=$minor" \
      sigs.k8s.io/cluster-api/cmd/clusterctl; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building clusterctl failed (log: $work/build.log)"; }
}

build_kustomize() {
  local out=$1 work=$CACHE_DIR/build/kustomize
  rm -rf "$work" && mkdir -p "$work"
  echo "tools: building kustomize $BITPOOL_KUSTOMIZE_VERSION (a minute, once)" >&2
  GOBIN=$work go install "sigs.k8s.io/kustomize/kustomize/v5@$BITPOOL_KUSTOMIZE_VERSION" >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building kustomize failed (log: $work/build.log)"; }
  mv "$work/kustomize" "$out"
}

# CAPM3's manager is its root module's main package; the root module takes its api module by a
# local replace, which the module zip does not carry: pin that api module to the same release.
# The public checksum database does not know the metal3-io modules: their sums are pinned in
# hack/upstream (go.sum and capm3-build.sum, trust on first use), and a metal3-io module missing
# from them fails the build instead of going unverified.
build_capm3() {
  local out=$1 work=$CACHE_DIR/build/capm3 module=github.com/metal3-io/cluster-api-provider-metal3
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  go mod init bitpool.test/capm3 >/dev/null 2>&1
  cat "$HACK_DIR/upstream/go.sum" "$HACK_DIR/upstream/capm3-build.sum" >go.sum
  go mod edit -require "$module@$BITPOOL_CAPM3_VERSION" -replace "$module/api=$module/api@$BITPOOL_CAPM3_VERSION"
  echo "tools: building CAPM3's manager $BITPOOL_CAPM3_VERSION (a few minutes, once)" >&2
  { go get "$module@$BITPOOL_CAPM3_VERSION" &&
    go build -trimpath -o "$out" -ldflags "-s -w" "$module"; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building CAPM3's manager failed (log: $work/build.log)"; }
}

# Metal3's ip-address-manager (the peer of bitpool's Metal3 IPAM in hack/load.sh) is its root
# module's main package; like CAPM3 it takes its api module by a local replace.
build_metal3_ipam() {
  local out=$1 work=$CACHE_DIR/build/metal3-ipam module=github.com/metal3-io/ip-address-manager
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  go mod init bitpool.test/metal3-ipam >/dev/null 2>&1
  go mod edit -require "$module@$BITPOOL_METAL3_IPAM_VERSION" -replace "$module/api=$module/api@$BITPOOL_METAL3_IPAM_VERSION"
  echo "tools: building Metal3's ip-address-manager $BITPOOL_METAL3_IPAM_VERSION (a few minutes, once)" >&2
  { go get "$module@$BITPOOL_METAL3_IPAM_VERSION" &&
    go build -trimpath -o "$out" -ldflags "-s -w" "$module"; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building Metal3's ip-address-manager failed (log: $work/build.log)"; }
}

# Cluster API core's manager is the root module's core package; like clusterctl, it takes its
# api module by a local replace.
build_capi_core() {
  local out=$1 work=$CACHE_DIR/build/capi-core module=sigs.k8s.io/cluster-api
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  go mod init bitpool.test/capi-core >/dev/null 2>&1
  go mod edit -require "$module@$BITPOOL_CAPI_VERSION" -replace "$module/api=$module/api@$BITPOOL_CAPI_VERSION"
  echo "tools: building Cluster API core's manager $BITPOOL_CAPI_VERSION (a few minutes, once)" >&2
  { go get "$module/core@$BITPOOL_CAPI_VERSION" &&
    go build -trimpath -o "$out" -ldflags "-s -w" "$module/core"; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building Cluster API core's manager failed (log: $work/build.log)"; }
}

# The baremetal-operator is its root module's main package, which takes its apis and hardwareutils
# modules by local replaces, and it needs ironic-standalone-operator's api module: each is pinned
# to a version the Go module proxy serves (see hack/versions.env). Checksums as for CAPM3.
build_bmo() {
  local out=$1 work=$CACHE_DIR/build/bmo module=github.com/metal3-io/baremetal-operator
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  go mod init bitpool.test/bmo >/dev/null 2>&1
  cat "$HACK_DIR/upstream/go.sum" "$HACK_DIR/upstream/capm3-build.sum" "$HACK_DIR/upstream/bmo-build.sum" >go.sum
  go mod edit -require "$module@$BITPOOL_BMO_VERSION" \
    -replace "$module/apis=$module/apis@$BITPOOL_BMO_APIS_VERSION" \
    -replace "$module/pkg/hardwareutils=$module/pkg/hardwareutils@$BITPOOL_BMO_HARDWAREUTILS_VERSION" \
    -replace "github.com/metal3-io/ironic-standalone-operator/api=github.com/metal3-io/ironic-standalone-operator/api@$BITPOOL_IRSO_API_VERSION"
  echo "tools: building the baremetal-operator $BITPOOL_BMO_VERSION (a few minutes, once)" >&2
  { go get "$module@$BITPOOL_BMO_VERSION" &&
    go build -trimpath -o "$out" -ldflags "-s -w" "$module"; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building the baremetal-operator failed (log: $work/build.log)"; }
}

# The in-cluster provider's manager is its module's root package.
build_in_cluster() {
  local out=$1 work=$CACHE_DIR/build/in-cluster module=sigs.k8s.io/cluster-api-ipam-provider-in-cluster
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  go mod init bitpool.test/in-cluster >/dev/null 2>&1
  go mod edit -require "$module@$BITPOOL_IN_CLUSTER_VERSION"
  echo "tools: building the in-cluster provider $BITPOOL_IN_CLUSTER_VERSION (a few minutes, once)" >&2
  { go get "$module@$BITPOOL_IN_CLUSTER_VERSION" &&
    go build -trimpath -o "$out" -ldflags "-s -w" "$module"; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building the in-cluster provider failed (log: $work/build.log)"; }
}

tool=${1:-}
case "$tool" in
  clusterctl) version=$BITPOOL_CAPI_VERSION ;;
  kustomize) version=$BITPOOL_KUSTOMIZE_VERSION ;;
  capm3) version=$BITPOOL_CAPM3_VERSION ;;
  in-cluster) version=$BITPOOL_IN_CLUSTER_VERSION ;;
  capi-core) version=$BITPOOL_CAPI_VERSION ;;
  bmo) version=$BITPOOL_BMO_VERSION ;;
  metal3-ipam) version=$BITPOOL_METAL3_IPAM_VERSION ;;
  *) die "usage: $0 clusterctl|kustomize|capm3|in-cluster|capi-core|bmo|metal3-ipam" ;;
esac
bin=$CACHE_DIR/tools/$tool-$version/$tool
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  exec 9>"$CACHE_DIR/tools/.lock" && flock 9
  if [ ! -x "$bin" ]; then
    go_env "$tool"
    "build_${tool//-/_}" "$bin.tmp"
    mv "$bin.tmp" "$bin"
    # The build cache is large and not needed again.
    chmod -R u+w "$CACHE_DIR/build" 2>/dev/null || true
    rm -rf "$CACHE_DIR/build/$tool"
  fi
fi
echo "$bin"
