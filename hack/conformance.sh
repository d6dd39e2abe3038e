#!/usr/bin/env bash
# Upstream's own controller specs as bitpool's conformance test.
#
#   hack/conformance.sh [in-cluster]
#
# Takes the in-cluster provider's module at the version pinned in hack/versions.env from the Go
# module proxy (verified against hack/upstream/go.sum), copies it to a scratch folder under
# $BITPOOL_CACHE_DIR, puts bitpool's own suite set-up (hack/conformance/in-cluster/suite_test.go)
# in place of the provider's, and runs the provider's Ginkgo specs unchanged on envtest, with the
# kube-apiserver and etcd that hack/control-plane.sh builds. The suite starts the `bitpool`
# binary ($BITPOOL_BIN, else built here) instead of upstream's reconcilers. No upstream file is
# kept in this repository: the module is fetched, the one replaced file is bitpool's.
#
# Prints `in-cluster conformance: N passed, M failed` and exits non-zero when a spec fails or the
# suite cannot run. Specs that call upstream's Go internals cannot judge another implementation
# and would be skipped here, each named with its reason in SKIPPED below; none does today.
#
# Metal3 ip-address-manager's and CAPM3's controller specs (controllers/*_test.go) are not run
# so: they call upstream's reconcilers directly, with gomock mocks of upstream's internal managers
# and controller-runtime's fake client, and never judge through an API server.
set -euo pipefail
HACK_DIR=$(cd "${0%/*}" && pwd)
ROOT=$(cd "$HACK_DIR/.." && pwd)
# shellcheck source=hack/versions.env
. "$HACK_DIR/versions.env"
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}

die() { echo "conformance: $*" >&2; exit 1; }
log() { echo "conformance: $*" >&2; }

# Ginkgo regular expression of the specs left out on purpose, with why; empty: every spec runs.
SKIPPED=""

suite=${1:-in-cluster}
[ "$suite" = in-cluster ] || die "unknown suite '$suite' (known: in-cluster)"
module=sigs.k8s.io/cluster-api-ipam-provider-in-cluster@$BITPOOL_IN_CLUSTER_VERSION

command -v go >/dev/null 2>&1 || die "missing prerequisite: Go on PATH (it builds the upstream specs)"
# Module downloads are shared with the other scripts; the build cache is this script's own, kept
# between runs (hack/control-plane.sh empties the shared one after its build).
export GOMODCACHE=$CACHE_DIR/go/mod GOCACHE=$CACHE_DIR/go/conformance-build GOFLAGS=-modcacherw GOTOOLCHAIN=local

# envtest starts kube-apiserver and etcd from one folder: the control plane's own builds.
"$HACK_DIR/control-plane.sh" build >&2
assets=$CACHE_DIR/envtest-assets/$BITPOOL_K8S_VERSION-$BITPOOL_ETCD_VERSION
mkdir -p "$assets"
ln -sf "$CACHE_DIR/kubernetes-$BITPOOL_K8S_VERSION/bin/kube-apiserver" "$assets/kube-apiserver"
ln -sf "$CACHE_DIR/etcd-$BITPOOL_ETCD_VERSION/bin/etcd" "$assets/etcd"
export KUBEBUILDER_ASSETS=$assets

if [ -z "${BITPOOL_BIN:-}" ]; then
  log "building bitpool"
  (cd "$ROOT" && cargo build --quiet --bin bitpool) || die "cargo build failed"
  BITPOOL_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/bitpool
fi
[ -x "$BITPOOL_BIN" ] || die "no bitpool binary at $BITPOOL_BIN"
export BITPOOL_BIN
# The CRDs bitpool ships for the capi-ipam group: its four pool kinds, nothing of Metal3.
BITPOOL_CRDS=$(printf '%s,' "$ROOT"/crds/ipam.cluster.x-k8s.io_*pools.yaml)
export BITPOOL_CRDS=${BITPOOL_CRDS%,}

json=$(cd "$HACK_DIR/upstream" && go mod download -json "$module" 2>&1) ||
  die "cannot download $module: $json"
source_dir=$(echo "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)
[ -d "$source_dir/internal/controllers" ] || die "$module has no internal/controllers"

work=$CACHE_DIR/conformance/$suite-$BITPOOL_IN_CLUSTER_VERSION
rm -rf "$work"
mkdir -p "$work"
cp -R "$source_dir/." "$work/"
chmod -R u+w "$work"
cp "$HACK_DIR/conformance/in-cluster/suite_test.go" "$work/internal/controllers/suite_test.go"

logs=${BITPOOL_CONFORMANCE_LOGS:-$ROOT/target/test-logs}
mkdir -p "$logs"
export BITPOOL_LOG=$logs/conformance-$suite-bitpool.log
out=$logs/conformance-$suite.log
log "running $module's controller specs against $BITPOOL_BIN (log: $out, bitpool's: $BITPOOL_LOG)"
set +e
(cd "$work" && go test ./internal/controllers/ -count=1 -timeout 30m -v \
  -args -ginkgo.no-color ${SKIPPED:+"-ginkgo.skip=$SKIPPED"}) >"$out" 2>&1
status=$?
set -e
# Ginkgo's summary: "FAIL! -- 41 Passed | 34 Failed | 0 Pending | 0 Skipped".
summary=$(grep -E '^(SUCCESS|FAIL)! -- [0-9]+ Passed \| [0-9]+ Failed' "$out" | tail -n 1 || true)
if [ -z "$summary" ]; then
  tail -n 40 "$out" >&2
  echo "in-cluster conformance: 0 passed, 1 failed"
  die "the suite did not run to its summary (exit $status; log: $out)"
fi
passed=$(echo "$summary" | sed -E 's/.* ([0-9]+) Passed.*/\1/')
failed=$(echo "$summary" | sed -E 's/.*\| ([0-9]+) Failed.*/\1/')
if [ "$failed" != 0 ] || [ "$status" != 0 ]; then
  grep -E '^\s*\[FAIL\]|^  \[FAILED\]' "$out" | sort -u >&2 || true
fi
echo "$suite conformance: $passed passed, $failed failed"
exit "$status"
