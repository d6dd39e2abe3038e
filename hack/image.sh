#!/usr/bin/env bash
# Builds bitpool's container image without pulling anything: static binaries for linux/amd64 and
# linux/arm64 (Rust's musl targets; Debian's musl-tools, and gcc-aarch64-linux-gnu to cross-compile
# ring's C for arm64) in an OCI image index of two images FROM scratch, each run as uid 65532,
# entrypoint /bitpool, no shell; built with Debian's buildah. The Dockerfile yields the same images
# in other pipelines.
#
#   hack/image.sh [--smoke] [TAG]      TAG defaults to dev
#
# Writes out/image/bitpool-TAG.tar (an OCI archive of the index: `skopeo copy --all
# oci-archive:… docker://…` or `buildah manifest push --all` publish it) and prints its size.
# --smoke then runs the amd64 image as uid 65532: `--version`, and `bitpool run` with in-cluster
# configuration (a ServiceAccount token, the API server of hack/control-plane.sh) until /readyz
# answers; and the arm64 image's binary under Debian's qemu-user against the same control plane,
# until it has served a claim.
# Needs root for apt-get and buildah's storage, as CI has; caches the build in $BITPOOL_CACHE_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}
ARCHES=(amd64 arm64)
triple() { case $1 in amd64) echo x86_64-unknown-linux-musl ;; arm64) echo aarch64-unknown-linux-musl ;; esac; }
smoke=""
if [ "${1:-}" = "--smoke" ]; then smoke=1; shift; fi
tag=${1:-dev}
out=out/image
log() { echo "image: $*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
[ -z "$smoke" ] || command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    die "cannot install ${missing[*]}"
fi
targets=()
for arch in "${ARCHES[@]}"; do
  t=$(triple "$arch")
  rustup target list --installed 2>/dev/null | grep -q "^$t\$" || rustup target add "$t" >&2
  targets+=(--target "$t")
done

log "building the static binaries (release, ${ARCHES[*]})"
export CARGO_TARGET_DIR=$CACHE_DIR/cargo-target
# A release's tag is the version the binary reports (`bitpool --version`, the build_info metric).
release_version=""
[[ $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] && release_version=$tag
BITPOOL_VERSION=$release_version BITPOOL_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || true) \
  CC_x86_64_unknown_linux_musl=musl-gcc \
  CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc \
  cargo build --release --locked "${targets[@]}" --bin bitpool >&2
binary_of() { echo "$CARGO_TARGET_DIR/$(triple "$1")/release/bitpool"; }
declare -A machine=([amd64]=x86-64 [arm64]=aarch64)
for arch in "${ARCHES[@]}"; do
  file "$(binary_of "$arch")" | grep -Eq "${machine[$arch]}.*static(-pie)?(ally)? linked" ||
    die "$(binary_of "$arch") is not a static ${machine[$arch]} binary: $(file "$(binary_of "$arch")")"
done
binary=$(binary_of amd64)

# vfs storage and chroot isolation work in containers and sandboxes without overlayfs or user
# namespaces.
bh() { buildah --storage-driver vfs "$@"; }
name=localhost/bitpool:$tag
# `bitpool v0.2.1 (commit 0123456789ab)`
read -r _ version _ commit < <("$binary" --version)
commit=${commit%)}
containers=() secrets="" smoke_ns="" running=""
# Stops a process and everything it started, children first: killing only the background shell
# would leave buildah and the image's bitpool running.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
cleanup() {
  [ -z "$running" ] || kill_tree "$running"
  [ ${#containers[@]} -eq 0 ] || bh rm "${containers[@]}" >/dev/null 2>&1 || true
  [ -z "$secrets" ] || rm -rf "$secrets"
  if [ -n "$smoke_ns" ]; then
    k delete namespace "$smoke_ns" --wait=false >/dev/null 2>&1 || true
    k delete clusterrolebinding "$smoke_ns" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
# One image per architecture, the same but for the binary, and the index of both.
for arch in "${ARCHES[@]}"; do
  container=$(bh from scratch)
  containers+=("$container")
  bh copy --chmod 0555 "$container" "$(binary_of "$arch")" /bitpool >/dev/null
  bh config --entrypoint '["/bitpool"]' --cmd run --user 65532:65532 --workingdir / \
    --os linux --arch "$arch" \
    --env BITPOOL_LOG_FORMAT=json \
    --label org.opencontainers.image.title=bitpool \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$commit" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$container"
  bh commit --quiet --format oci "$container" "$name-$arch" >/dev/null
done
bh manifest rm "$name" >/dev/null 2>&1 || bh rmi "$name" >/dev/null 2>&1 || true
bh manifest create "$name" >/dev/null
for arch in "${ARCHES[@]}"; do
  bh manifest add --os linux --arch "$arch" "$name" "containers-storage:$name-$arch" >/dev/null
done
platforms=$(bh manifest inspect "$name" | python3 -c 'import json,sys; print(" ".join(sorted(m["platform"]["os"]+"/"+m["platform"]["architecture"] for m in json.load(sys.stdin)["manifests"])))')
[ "$platforms" = "linux/amd64 linux/arm64" ] || die "the index holds $platforms, not linux/amd64 linux/arm64"
mkdir -p "$out"
rm -f "$out/bitpool-$tag.tar"
bh manifest push --quiet --all --format oci "$name" "oci-archive:$out/bitpool-$tag.tar" >/dev/null
# Earlier builds of the same tag are left untagged: drop them.
bh rmi --prune >/dev/null 2>&1 || true
size=$(stat -c %s "$binary")
compressed=$(gzip -c "$out/bitpool-$tag.tar" | wc -c)
log "built $name ($platforms): amd64 binary $((size / 1024)) KiB, index $((compressed / 1024)) KiB compressed -> $out/bitpool-$tag.tar"

[ -n "$smoke" ] || exit 0

run_image() { bh run --isolation chroot --user 65532:65532 "$@"; }
probe=$(bh from "$name-amd64")
containers+=("$probe")
run_image "$probe" -- /bitpool --version | grep -qx "bitpool $version (commit $commit)" || die "the image does not run as uid 65532"

# In-cluster configuration: the API server's address in the environment, a ServiceAccount's
# token and the cluster CA where every pod has them.
kubeconfig=${KUBECONFIG:-$(hack/control-plane.sh up)}
server=$(KUBECONFIG=$kubeconfig kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
host=${server#https://}
k() { KUBECONFIG=$kubeconfig kubectl "$@"; }
KUBECONFIG=$kubeconfig "$binary" crds --apply --standalone >/dev/null
ns=bitpool-image-smoke-$RANDOM
secrets=$(mktemp -d)
smoke_ns=$ns
k create namespace "$ns" >/dev/null
k -n "$ns" create serviceaccount bitpool >/dev/null
k create clusterrolebinding "$ns" --clusterrole cluster-admin --serviceaccount "$ns:bitpool" >/dev/null
k -n "$ns" create token bitpool >"$secrets/token"
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}' |
  xargs cat >"$secrets/ca.crt"
echo "$ns" >"$secrets/namespace"
chmod -R a+rX "$secrets"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run_image --env KUBERNETES_SERVICE_HOST="${host%:*}" --env KUBERNETES_SERVICE_PORT="${host##*:}" \
  --env BITPOOL_LEDGER_NAMESPACE="$ns" --env BITPOOL_WATCH_FILTER="$ns" \
  --volume "$secrets:/var/run/secrets/kubernetes.io/serviceaccount:ro" \
  "$probe" -- /bitpool run --controllers=capi-ipam --webhook-port=0 --diagnostics-address=0 \
  --health-addr="127.0.0.1:$port" >"$out/smoke.log" 2>&1 &
running=$!
ready=""
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$running" 2>/dev/null || break
  sleep 0.5
done
kill_tree "$running"
wait "$running" 2>/dev/null || true
running=""
[ -n "$ready" ] || { tail -n 20 "$out/smoke.log" >&2; die "the image did not become ready in-cluster (log: $out/smoke.log)"; }
log "smoke test passed: ran as uid 65532 with in-cluster configuration and became ready"

# The arm64 image's own binary, taken out of it, under Debian's qemu-user: against the same control
# plane (as an administrator's kubeconfig), it serves a claim of a pool of its namespace.
arm=$(bh from --arch arm64 "$name-arm64")
containers+=("$arm")
mnt=$(bh mount "$arm")
cp "$mnt/bitpool" "$secrets/bitpool-arm64"
bh umount "$arm" >/dev/null
file "$secrets/bitpool-arm64" | grep -q "aarch64" || die "the arm64 image holds $(file -b "$secrets/bitpool-arm64")"
qemu-aarch64 "$secrets/bitpool-arm64" --version | grep -qx "bitpool $version (commit $commit)" ||
  die "the arm64 binary does not run under qemu-aarch64"
KUBECONFIG=$kubeconfig qemu-aarch64 "$secrets/bitpool-arm64" run --controllers=capi-ipam \
  --namespace "$ns" --watch-filter "$ns" --ledger-namespace "$ns" --webhook-port=0 \
  --diagnostics-address=0 --health-addr=0 >"$out/smoke-arm64.log" 2>&1 &
running=$!
k apply -f - >/dev/null <<YAML
apiVersion: ipam.cluster.x-k8s.io/v1alpha2
kind: InClusterIPPool
metadata: {name: arm64, namespace: $ns, labels: {cluster.x-k8s.io/watch-filter: $ns}}
spec: {addresses: [10.64.0.10-10.64.0.20], prefix: 24, gateway: 10.64.0.1}
---
apiVersion: ipam.cluster.x-k8s.io/v1beta2
kind: IPAddressClaim
metadata: {name: arm64, namespace: $ns, labels: {cluster.x-k8s.io/watch-filter: $ns}}
spec:
  poolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: arm64}
YAML
served=""
k -n "$ns" wait --for=condition=Ready ipaddressclaims.ipam.cluster.x-k8s.io/arm64 --timeout=120s >/dev/null 2>&1 && served=1
address=$(k -n "$ns" get ipaddresses.ipam.cluster.x-k8s.io arm64 -o jsonpath='{.spec.address}' 2>/dev/null || true)
# Released while it runs, so that no finalizer outlives it and its namespace goes.
k -n "$ns" delete ipaddressclaims.ipam.cluster.x-k8s.io arm64 --timeout=60s >/dev/null 2>&1 || true
k -n "$ns" delete inclusterippools.ipam.cluster.x-k8s.io arm64 --timeout=60s >/dev/null 2>&1 || true
kill_tree "$running"
wait "$running" 2>/dev/null || true
running=""
[ -n "$served" ] && [ "$address" = 10.64.0.10 ] ||
  { tail -n 20 "$out/smoke-arm64.log" >&2; die "the arm64 binary did not serve the claim under qemu-aarch64 (address ${address:-none}; log: $out/smoke-arm64.log)"; }
log "smoke test passed: the arm64 image's binary served a claim ($address) under qemu-aarch64"
