#!/usr/bin/env bash
# The load command: builds bitpool and bitpool-load (release), and with --peer the upstream
# in-cluster provider, Metal3's ip-address-manager and CAPM3 (hack/tools.sh), brings up the local control
# plane unless $KUBECONFIG is set, and runs bitpool-load with the remaining arguments. It prints a
# Markdown table for BENCHMARKS.md.
#
#   hack/load.sh --claims 1000,3000,10000 --peer     bursts on one pool, bitpool and upstream
#   hack/load.sh --metal3-claims 1000,5000 --peer    bursts on one Metal3 IPPool, bitpool and
#                                                    Metal3's ip-address-manager
#   hack/load.sh --metal3-hosts 200 --peer           200 hosts rendered with CAPM3 running: CAPM3
#                                                    rendering with the upstream IPAM providers,
#                                                    CAPM3 rendering with bitpool, bitpool alone
#   hack/load.sh --pools 1000x10 --peer              many pools
#   hack/load.sh --backlog 10000,50000               backlogs served from a fresh start
#   hack/load.sh --chunked 10000                     500 at a time on a /16 and a /64, then on a
#                                                    /8 and ::/0 (memory by the work's shape)
#   hack/load.sh --hold 100000                       memory and start-up with 100,000 allocated
#   hack/load.sh --admission 50000                   a pool delete's and update's admission, 50,000 allocated
#
# bitpool-load --help lists every option (connections, the peer's largest run, timeouts).
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
peer=""
for arg in "$@"; do
  if [ "$arg" = --peer ]; then peer=1; else args+=("$arg"); fi
done

started_plane=""
if [ -z "${KUBECONFIG:-}" ]; then
  hack/control-plane.sh status >/dev/null 2>&1 || started_plane=1
  KUBECONFIG=$(hack/control-plane.sh up)
  export KUBECONFIG
fi
[ -z "$started_plane" ] || trap 'hack/control-plane.sh down' EXIT

echo "load: building bitpool and bitpool-load (release)" >&2
cargo build --quiet --release --bin bitpool --bin bitpool-load
if [ -n "$peer" ]; then
  args+=(--in-cluster "$(hack/tools.sh in-cluster)" --metal3-ipam "$(hack/tools.sh metal3-ipam)"
    --capm3 "$(hack/tools.sh capm3)")
fi
echo "load: machine: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB, $(uname -r)" >&2
target/release/bitpool-load --bitpool target/release/bitpool \
  --upstream-crds "$(hack/upstream-crds.sh)" "${args[@]}"
