#!/usr/bin/env bash
# A real Kubernetes control plane for bitpool's tests and demo: etcd + kube-apiserver +
# kube-controller-manager (namespace and garbage-collector controllers), on 127.0.0.1 only.
#
#   hack/control-plane.sh build   install Debian prerequisites, build kube-apiserver and
#                                 kube-controller-manager v1.20.2 from Debian's source package
#                                 (once; cached in $BITPOOL_CACHE_DIR)
#   hack/control-plane.sh up      build if needed, start everything, wait until ready, print
#                                 the kubeconfig path (idempotent: an already running plane is reused)
#   hack/control-plane.sh down    stop the processes this script started, by PID
#   hack/control-plane.sh status  say whether it runs and where its kubeconfig is
#   hack/control-plane.sh kubeconfig   print the kubeconfig path
#
# Environment: BITPOOL_CACHE_DIR (default ~/.cache/bitpool), BITPOOL_CP_DIR (runtime state,
# default /tmp/bitpool-control-plane), BITPOOL_CP_PORT (apiserver port, default 16443),
# BITPOOL_ETCD_PORT (default 12379; the peer port is this + 1).
set -euo pipefail

K8S_VERSION=1.20.2
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}
BIN_DIR=$CACHE_DIR/kubernetes-$K8S_VERSION/bin
STATE_DIR=${BITPOOL_CP_DIR:-/tmp/bitpool-control-plane}
API_PORT=${BITPOOL_CP_PORT:-16443}
ETCD_PORT=${BITPOOL_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KUBECONFIG_PATH=$STATE_DIR/kubeconfig
GO_ROOT=/usr/lib/go-1.19

die() { echo "control-plane: $*" >&2; exit 1; }
log() { echo "control-plane: $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the build and the running plane need, each with the command that proves it.
ensure_packages() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v flock >/dev/null 2>&1 || missing+=(util-linux)
  if [ ! -x "$BIN_DIR/kube-apiserver" ] || [ ! -x "$BIN_DIR/kube-controller-manager" ]; then
    [ -x "$GO_ROOT/bin/go" ] || missing+=(golang-1.19-go)
    command -v rsync >/dev/null 2>&1 || missing+=(rsync)
    command -v dpkg-source >/dev/null 2>&1 || missing+=(dpkg-dev)
    [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || missing+=(golang-github-modern-go-reflect2-dev)
    command -v make >/dev/null 2>&1 || missing+=(make)
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 ||
    die "missing prerequisites: ${missing[*]} (Debian packages), and there is no apt-get to install them"
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq || die "apt-get update failed; cannot install: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install failed for: ${missing[*]}"
}

# The machine's own Debian mirror URI, so that no host name is written into the project.
debian_uri() {
  local uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $0 ~ /bookworm/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || die "cannot find the Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
  echo "$uri"
}

build() {
  if [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ]; then
    log "kube-apiserver and kube-controller-manager $K8S_VERSION are cached in $BIN_DIR"
    return 0
  fi
  ensure_packages
  local work=$CACHE_DIR/build
  rm -rf "$work"
  mkdir -p "$work/apt/etc" "$work/apt/lists/partial" "$work/src"
  cat >"$work/apt/etc/kubernetes-src.sources" <<EOF
Types: deb-src
URIs: $(debian_uri)
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  local apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/apt/etc"
    -o "Dir::State::Lists=$work/apt/lists" -o Debug::NoLocking=1)
  log "fetching Debian's kubernetes source package (about 34 MB)"
  apt-get "${apt_opts[@]}" update -qq || die "apt-get update of the deb-src entry failed"
  (cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only -qq kubernetes) ||
    die "apt-get source kubernetes failed"
  (cd "$work/src" && dpkg-source -x --no-check ./*.dsc tree >/dev/null) || die "dpkg-source could not unpack the source"
  local tree=$work/src/tree

  # reflect2 1.0.1 (vendored) crashes with Go >= 1.18; Debian's newer copy does not.
  rm -rf "$tree/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$tree/vendor/github.com/modern-go/reflect2"
  rm -f "$tree/vendor/github.com/modern-go/reflect2/go.mod"
  # kube-openapi PR 230 (in Kubernetes 1.21): with Go >= 1.16 the zero-value test treats "" as null.
  local f
  for f in vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go vendor/github.com/go-openapi/validate/type.go; do
    [ -f "$tree/$f" ] || continue
    sed -i 's/if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {/if data == nil {/' "$tree/$f"
    grep -q 'if data == nil {' "$tree/$f" || die "could not apply the zero-value fix to $f"
  done

  log "building kube-apiserver and kube-controller-manager (about 5 minutes on 2 cores)"
  (cd "$tree" && env PATH="$GO_ROOT/bin:$PATH" GOPROXY=off GOSUMDB=off GOFLAGS= \
    GOCACHE="$work/gocache" GOPATH="$work/gopath" \
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" GOLDFLAGS="-s -w" \
    KUBE_BUILD_PLATFORMS=linux/amd64 >"$work/build.log" 2>&1) ||
    { tail -n 30 "$work/build.log" >&2; die "the Kubernetes build failed (log: $work/build.log)"; }
  mkdir -p "$BIN_DIR"
  cp "$tree/_output/local/bin/linux/amd64/kube-apiserver" "$tree/_output/local/bin/linux/amd64/kube-controller-manager" "$BIN_DIR/"
  chmod -R u+w "$work" && rm -rf "$work"
  log "cached in $BIN_DIR"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

running() {
  pid_alive "$STATE_DIR/etcd.pid" && pid_alive "$STATE_DIR/kube-apiserver.pid" &&
    pid_alive "$STATE_DIR/kube-controller-manager.pid"
}

wait_ready() {
  local what=$1 url=$2 deadline=$(($(date +%s) + $3))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if curl -s --cacert "$STATE_DIR/pki/ca.crt" --max-time 2 -H "Authorization: Bearer $(cat "$STATE_DIR/token")" "$url" 2>/dev/null | grep -q '^ok'; then
      return 0
    fi
    sleep 0.5
  done
  return 1
}

start_process() {
  local name=$1; shift
  # 9>&-: the daemons must not inherit the lock, or the next `up` would wait on it forever.
  "$@" >"$STATE_DIR/$name.log" 2>&1 9>&- &
  echo $! >"$STATE_DIR/$name.pid"
}

up() {
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/lock"
  flock -w 600 9 || die "another hack/control-plane.sh up holds $STATE_DIR/lock"
  if running; then
    echo "$KUBECONFIG_PATH"
    return 0
  fi
  build
  ensure_packages
  down_quiet
  local pki=$STATE_DIR/pki
  rm -rf "$STATE_DIR/etcd-data" "$pki"
  mkdir -p "$pki"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=bitpool-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  # A serving certificate for 127.0.0.1 signed by that CA, so clients verify the server.
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/serving.key" \
    -out "$pki/serving.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$pki/serving.ext"
  openssl x509 -req -in "$pki/serving.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/serving.ext" -out "$pki/serving.crt" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE_DIR/token"
  echo "$(cat "$STATE_DIR/token"),admin,admin,system:masters" >"$STATE_DIR/tokens.csv"
  cat >"$KUBECONFIG_PATH" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: bitpool-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$STATE_DIR/token")
contexts:
- name: bitpool-test
  context: {cluster: bitpool-test, user: admin, namespace: default}
current-context: bitpool-test
EOF

  start_process etcd etcd --name bitpool-test --data-dir "$STATE_DIR/etcd-data" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "bitpool-test=http://127.0.0.1:$ETCD_PEER_PORT"
  start_process kube-apiserver "$BIN_DIR/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$API_PORT" --insecure-port 0 \
    --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
    --tls-cert-file "$pki/serving.crt" --tls-private-key-file "$pki/serving.key" \
    --token-auth-file "$STATE_DIR/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
    --client-ca-file "$pki/ca.crt"
  if ! wait_ready kube-apiserver "https://127.0.0.1:$API_PORT/readyz" 60; then
    tail -n 20 "$STATE_DIR/kube-apiserver.log" >&2
    down_quiet
    die "kube-apiserver did not become ready within 60 s (log: $STATE_DIR/kube-apiserver.log)"
  fi
  start_process kube-controller-manager "$BIN_DIR/kube-controller-manager" --kubeconfig "$KUBECONFIG_PATH" \
    --controllers namespace,garbagecollector,serviceaccount-token --leader-elect=false \
    --secure-port 0 --port 0 --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=false
  sleep 1
  pid_alive "$STATE_DIR/kube-controller-manager.pid" ||
    { tail -n 20 "$STATE_DIR/kube-controller-manager.log" >&2; down_quiet; die "kube-controller-manager exited at start"; }
  log "ready: export KUBECONFIG=$KUBECONFIG_PATH"
  echo "$KUBECONFIG_PATH"
}

stop_pid_file() {
  local f=$1
  [ -f "$f" ] || return 0
  local pid
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

down_quiet() {
  local p
  for p in kube-controller-manager kube-apiserver etcd; do stop_pid_file "$STATE_DIR/$p.pid"; done
}

down() {
  down_quiet
  log "stopped"
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  status) if running; then echo "running; KUBECONFIG=$KUBECONFIG_PATH"; else echo "not running"; exit 1; fi ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
