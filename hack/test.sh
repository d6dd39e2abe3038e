#!/usr/bin/env bash
# Runs every check and test bitpool has: formatting, clippy, the CRD and RBAC drift and
# compatibility tests, unit and property tests, the integration tests against a real control
# plane (clusterctl and RBAC tests on planes of their own), and the container image build.
# Uses $KUBECONFIG when set; otherwise starts the local control plane (hack/control-plane.sh)
# and stops it again at the end if this script started it.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

# The webhook tests check denials as users see them, through kubectl.
if ! command -v kubectl >/dev/null 2>&1; then
  echo "test: installing kubectl (Debian package kubernetes-client)" >&2
  if [ "$(id -u)" = 0 ]; then sudo() { "$@"; }; fi
  sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
fi

# The alert tests run Prometheus and promtool (the package's daemon is not started here: no
# systemd; the test starts its own on 127.0.0.1).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "test: installing Prometheus and promtool (Debian package prometheus)" >&2
  if [ "$(id -u)" = 0 ]; then sudo() { "$@"; }; fi
  sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi

# The clock tests run bitpool on machines whose clocks are wrong, with libfaketime.
if ! ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1; then
  echo "test: installing libfaketime (Debian package libfaketime)" >&2
  if [ "$(id -u)" = 0 ]; then sudo() { "$@"; }; fi
  sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfaketime >/dev/null
fi

# A clean checkout gains nothing from incremental compilation, whose files would double the
# size of the test build on disk.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi

stop_plane=""
if [ -z "${KUBECONFIG:-}" ]; then
  if ! hack/control-plane.sh status >/dev/null 2>&1; then
    stop_plane=1
    trap 'hack/control-plane.sh down' EXIT
  fi
  KUBECONFIG=$(hack/control-plane.sh up)
  export KUBECONFIG
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings
# Upstream's own controller specs against bitpool (hack/conformance.sh), on an envtest API server
# of their own, beside the cargo tests: mostly waiting, little CPU once compiled. They run a copy
# of the binary, so that nothing cargo does meanwhile changes it under them.
echo "== hack/conformance.sh in-cluster (in the background)"
cargo build --quiet --bin bitpool
conformance_dir=$(mktemp -d)
cp "${CARGO_TARGET_DIR:-target}/debug/bitpool" "$conformance_dir/bitpool"
BITPOOL_BIN=$conformance_dir/bitpool hack/conformance.sh in-cluster >"$conformance_dir/out" 2>&1 &
conformance_pid=$!
# The whole Metal3 stack's scenarios (tests/metal3_stack.rs, tests named whole_stack_*): each on
# a plane of its own (the pivot two), mostly waiting on the upstream managers' requeue timers, so
# two at a time in the background, beside the other tests (which skip them). More at once load two
# cores past what the fault tests' waits allow: with the pivot, three at a time failed a different
# fault test in each of three runs.
echo "== cargo test --test metal3_stack whole_stack_ (in the background)"
stack_bin=$(cargo test --quiet --test metal3_stack --no-run --message-format=json |
  sed -n 's/.*"executable":"\([^"]*metal3_stack[^"]*\)".*/\1/p' | tail -1)
[ -x "$stack_bin" ] || { echo "test: no metal3_stack test binary" >&2; exit 1; }
"$stack_bin" --test-threads=2 whole_stack_ >"$conformance_dir/stack" 2>&1 &
stack_pid=$!
echo "== cargo test (KUBECONFIG=$KUBECONFIG)"
log=$(mktemp)
trap 'kill "$conformance_pid" "$stack_pid" 2>/dev/null || true; rm -rf "$log" "$conformance_dir"; [ -n "${stop_plane:-}" ] && hack/control-plane.sh down' EXIT
set +e
# --tests: the library's and binaries' unit tests and the integration tests (libtest, which
# takes --skip); criterion's bench harness takes no such flag, so the bench targets and examples
# run apart (by name: --benches would take the library's unit tests again).
cargo test --tests --no-fail-fast "$@" -- --skip whole_stack_ 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
cargo test --bench '*' --examples --no-fail-fast "$@" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== cargo test --test metal3_stack whole_stack_"
wait "$stack_pid" || status=1
cat "$conformance_dir/stack"
grep -q '^test result:' "$conformance_dir/stack" || { echo "test result: metal3_stack. 0 passed; 1 failed" >>"$log"; status=1; }
grep '^test result:' "$conformance_dir/stack" >>"$log"
echo "== hack/conformance.sh in-cluster"
wait "$conformance_pid" || status=1
cat "$conformance_dir/out"
grep -E '^[a-z-]+ conformance: [0-9]+ passed, [0-9]+ failed$' "$conformance_dir/out" |
  sed -E 's/^[a-z-]+ conformance: ([0-9]+) passed, ([0-9]+) failed$/test result: conformance. \1 passed; \2 failed/' >>"$log" ||
  { echo "conformance: no summary"; echo "test result: conformance. 0 passed; 1 failed" >>"$log"; status=1; }
# The container image: built from scratch with buildah and run as its user, in-cluster (root
# installs what it needs; elsewhere it runs only where buildah is installed).
image=skipped
if [ "$(id -u)" = 0 ] || command -v buildah >/dev/null 2>&1; then
  echo "== hack/image.sh --smoke"
  if hack/image.sh --smoke; then image=passed; else image=failed; status=1; fi
else
  echo "== image: skipped (needs root, or buildah installed)"
fi
set -e
# One closing line over every test binary and the image (criterion's output comes last otherwise).
awk -v image="$image" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { if (image == "passed") p++; if (image == "failed") f++; printf "bitpool: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
