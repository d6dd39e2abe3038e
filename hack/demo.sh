#!/usr/bin/env bash
# bitpool's main job, end to end: brings up the local control plane unless $KUBECONFIG is set,
# installs the CRDs, runs the provider, applies config/samples/demo.yaml (a pool and four claims)
# and shows the addresses the claims got. Set BITPOOL_DEMO_KEEP=1 to leave bitpool running,
# BITPOOL_BIN to run a bitpool already built.
set -euo pipefail
cd "$(dirname "$0")/.."

started_plane=""
if [ -z "${KUBECONFIG:-}" ]; then
  hack/control-plane.sh status >/dev/null 2>&1 || started_plane=1
  KUBECONFIG=$(hack/control-plane.sh up)
  export KUBECONFIG
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "demo: installing kubectl (Debian package kubernetes-client)" >&2
  if [ "$(id -u)" = 0 ]; then sudo() { "$@"; }; fi
  sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
fi

bitpool=${BITPOOL_BIN:-}
if [ -z "$bitpool" ]; then
  echo "demo: building bitpool" >&2
  cargo build --quiet --bin bitpool
  bitpool=${CARGO_TARGET_DIR:-target}/debug/bitpool
fi

# Cluster API core brings the claim and address kinds; without it bitpool installs them too.
standalone=()
if ! kubectl get crd ipaddressclaims.ipam.cluster.x-k8s.io >/dev/null 2>&1; then
  echo "demo: no Cluster API core here; bitpool installs the IPAddressClaim and IPAddress CRDs too" >&2
  standalone=(--standalone)
fi
"$bitpool" crds --apply "${standalone[@]}"

log=$(mktemp -t bitpool-demo.XXXXXX.log)
"$bitpool" run --webhook-port=0 --health-addr="${BITPOOL_HEALTH_ADDR:-127.0.0.1:9440}" \
  --diagnostics-address="${BITPOOL_DIAGNOSTICS_ADDRESS:-127.0.0.1:8080}" --insecure-diagnostics >"$log" 2>&1 &
pid=$!
cleanup() {
  if [ "${BITPOOL_DEMO_KEEP:-}" != 1 ]; then
    kill "$pid" 2>/dev/null || true
    # An `if`, not `&&`: a false test as the trap's last command would be the script's status.
    if [ -n "$started_plane" ]; then hack/control-plane.sh down; fi
  fi
}
trap cleanup EXIT
echo "demo: bitpool running (pid $pid, log $log)" >&2

kubectl apply -f config/samples/demo.yaml >&2
deadline=$((SECONDS + 60))
until [ "$(kubectl -n bitpool-demo get ipaddressclaims -o jsonpath='{range .items[*]}{.status.addressRef.name}{" "}{end}' | wc -w)" = 5 ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "demo: claims did not get addresses within 60 s; bitpool's log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  kill -0 "$pid" 2>/dev/null || { echo "demo: bitpool exited:" >&2; tail -n 30 "$log" >&2; exit 1; }
  sleep 0.5
done

echo
kubectl -n bitpool-demo get inclusterippools
echo
kubectl -n bitpool-demo get inclusterprefixpools
echo
# Each claim with the address it holds: its status names the address object, which holds the
# address (named after the claim, so kubectl's columns alone would show the claim's name twice).
claims='{range .items[*]}{.metadata.name}{"\t"}{.status.conditions[?(@.type=="Ready")].status}{"\t"}{.status.conditions[?(@.type=="Ready")].reason}{"\t"}{.status.addressRef.name}{"\n"}{end}'
addresses='{range .items[*]}{.metadata.name}{"\t"}{.spec.address}/{.spec.prefix}{"\t"}{.spec.gateway}{"\n"}{end}'
awk -F '\t' 'BEGIN { printf "%-16s %-6s %-18s %-20s %s\n", "CLAIM", "READY", "REASON", "ADDRESS", "GATEWAY" }
  FNR == NR { address[$1] = $2; gateway[$1] = $3; next }
  { held = ($4 in address)
    printf "%-16s %-6s %-18s %-20s %s\n", $1, or_none($2), or_none($3), held ? address[$4] : "<none>", held ? or_none(gateway[$4]) : "<none>" }
  function or_none(value) { return value == "" ? "<none>" : value }' \
  <(kubectl -n bitpool-demo get ipaddresses.ipam.cluster.x-k8s.io -o jsonpath="$addresses") \
  <(kubectl -n bitpool-demo get ipaddressclaims -o jsonpath="$claims")
echo
kubectl -n bitpool-demo get ipaddresses.ipam.cluster.x-k8s.io
if [ "${BITPOOL_DEMO_KEEP:-}" = 1 ]; then
  echo
  echo "demo: bitpool keeps running (pid $pid); KUBECONFIG=$KUBECONFIG"
fi
