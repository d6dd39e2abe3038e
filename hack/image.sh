#!/usr/bin/env bash
# Builds bitpool's container image without pulling anything: a static binary (Rust's musl target,
# Debian's musl-tools) in an OCI image FROM scratch, run as uid 65532, entrypoint /bitpool, no
# shell; built with Debian's buildah. The Dockerfile yields the same image in other pipelines.
#
#   hack/image.sh [--smoke] [TAG]      TAG defaults to dev
#
# Writes out/image/bitpool-TAG.tar (an OCI archive: `skopeo copy oci-archive:… docker://…`,
# `podman load`, or `buildah push` publish it) and prints its size. --smoke then runs the image
# as uid 65532: `--version`, and `bitpool run` with in-cluster configuration (a ServiceAccount
# token, the API server of hack/control-plane.sh) until /readyz answers.
# Needs root for apt-get and buildah's storage, as CI has; caches the build in $BITPOOL_CACHE_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}
TARGET=x86_64-unknown-linux-musl
smoke=""
if [ "${1:-}" = "--smoke" ]; then smoke=1; shift; fi
tag=${1:-dev}
out=out/image
log() { echo "image: $*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    die "cannot install ${missing[*]}"
fi
rustup target list --installed 2>/dev/null | grep -q "^$TARGET\$" || rustup target add "$TARGET" >&2

log "building the static binary (release, $TARGET)"
export CARGO_TARGET_DIR=$CACHE_DIR/cargo-target
# A release's tag is the version the binary reports (`bitpool --version`, the build_info metric).
release_version=""
[[ $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] && release_version=$tag
BITPOOL_VERSION=$release_version BITPOOL_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || true) \
  CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --locked --target "$TARGET" --bin bitpool >&2
binary=$CARGO_TARGET_DIR/$TARGET/release/bitpool
file "$binary" 2>/dev/null | grep -q "static" || ldd "$binary" 2>&1 | grep -q "not a dynamic\|statically" ||
  die "$binary is not static"

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
container=$(bh from scratch)
containers+=("$container")
bh copy --chmod 0555 "$container" "$binary" /bitpool >/dev/null
bh config --entrypoint '["/bitpool"]' --cmd run --user 65532:65532 --workingdir / \
  --env BITPOOL_LOG_FORMAT=json \
  --label org.opencontainers.image.title=bitpool \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$commit" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$container"
bh commit --quiet --format oci "$container" "$name" >/dev/null
mkdir -p "$out"
rm -f "$out/bitpool-$tag.tar"
bh push --quiet "$name" "oci-archive:$out/bitpool-$tag.tar" >/dev/null
# Earlier builds of the same tag are left untagged: drop them.
bh rmi --prune >/dev/null 2>&1 || true
size=$(stat -c %s "$binary")
compressed=$(gzip -c "$out/bitpool-$tag.tar" | wc -c)
log "built $name: binary $((size / 1024)) KiB, image $((compressed / 1024)) KiB compressed -> $out/bitpool-$tag.tar"

[ -n "$smoke" ] || exit 0

run_image() { bh run --isolation chroot --user 65532:65532 "$@"; }
probe=$(bh from "$name")
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
