#!/usr/bin/env bash
# bitpool's main job, end to end: brings up the local control plane unless $KUBECONFIG is set,
# installs the CRDs, runs the provider, applies config/samples/demo.yaml (a pool and four claims)
# and shows the addresses the claims got. Set BITPOOL_DEMO_KEEP=1 to leave bitpool running.
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

echo "demo: building bitpool" >&2
cargo build --quiet --bin bitpool
bitpool=target/debug/bitpool

"$bitpool" crds --apply >/dev/null
if ! kubectl get crd ipaddressclaims.ipam.cluster.x-k8s.io >/dev/null 2>&1; then
  echo "demo: no Cluster API core here; installing IPAddressClaim and IPAddress CRDs" >&2
  "$bitpool" crds --apply --standalone >/dev/null
fi

log=$(mktemp -t bitpool-demo.XXXXXX.log)
"$bitpool" run --webhook-port=0 --health-addr=127.0.0.1:9440 --diagnostics-address=127.0.0.1:8080 --insecure-diagnostics >"$log" 2>&1 &
pid=$!
cleanup() {
  if [ "${BITPOOL_DEMO_KEEP:-}" != 1 ]; then
    kill "$pid" 2>/dev/null || true
    [ -n "$started_plane" ] && hack/control-plane.sh down
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
kubectl -n bitpool-demo get ipaddressclaims \
  -o custom-columns='CLAIM:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,REASON:.status.conditions[?(@.type=="Ready")].reason,ADDRESS:.status.addressRef.name'
echo
kubectl -n bitpool-demo get ipaddresses.ipam.cluster.x-k8s.io
if [ "${BITPOOL_DEMO_KEEP:-}" = 1 ]; then
  echo
  echo "demo: bitpool keeps running (pid $pid); KUBECONFIG=$KUBECONFIG"
fi
