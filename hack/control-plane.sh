#!/usr/bin/env bash
# A real Kubernetes control plane for bitpool's tests and demo: etcd + kube-apiserver +
# kube-controller-manager (namespace, garbage-collector and service-account-token controllers),
# on 127.0.0.1 only, with TLS that clients verify.
#
#   hack/control-plane.sh build   build kube-apiserver, kube-controller-manager and etcd from the
#                                 Go module proxy with the machine's Go (once; cached in
#                                 $BITPOOL_CACHE_DIR)
#   hack/control-plane.sh up      build if needed, start everything, wait until ready, print
#                                 the kubeconfig path (idempotent: an already running plane is reused)
#   hack/control-plane.sh down    stop the processes this script started, by PID
#   hack/control-plane.sh restart-apiserver [S]   stop kube-apiserver, wait S seconds, start it
#                                 again (tests)
#   hack/control-plane.sh status  say whether it runs and where its kubeconfig is
#   hack/control-plane.sh kubeconfig   print the kubeconfig path
#
# Versions: hack/versions.env (BITPOOL_K8S_VERSION, BITPOOL_ETCD_VERSION). Environment:
# BITPOOL_CACHE_DIR (default ~/.cache/bitpool), BITPOOL_CP_DIR (runtime state, default
# /tmp/bitpool-control-plane), BITPOOL_CP_PORT (apiserver port, default 16443), BITPOOL_ETCD_PORT
# (default 12379; the peer port is this + 1), BITPOOL_APISERVER_MEMORY_LIMIT (the API server's Go
# memory limit, GOMEMLIMIT; default three quarters of the machine's memory), BITPOOL_APISERVER_ARGS
# (more kube-apiserver flags, split at spaces: a feature gate off, a resource without watch cache).
set -euo pipefail
HACK_DIR=$(cd "${0%/*}" && pwd)
# shellcheck source=hack/versions.env
. "$HACK_DIR/versions.env"

K8S_VERSION=$BITPOOL_K8S_VERSION
ETCD_VERSION=$BITPOOL_ETCD_VERSION
CACHE_DIR=${BITPOOL_CACHE_DIR:-$HOME/.cache/bitpool}
BIN_DIR=$CACHE_DIR/kubernetes-$K8S_VERSION/bin
ETCD_BIN=$CACHE_DIR/etcd-$ETCD_VERSION/bin/etcd
STATE_DIR=${BITPOOL_CP_DIR:-/tmp/bitpool-control-plane}
API_PORT=${BITPOOL_CP_PORT:-16443}
ETCD_PORT=${BITPOOL_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KUBECONFIG_PATH=$STATE_DIR/kubeconfig
# What a running plane must match to be reused: versions and the flags that matter. The
# OwnerReferencesPermissionEnforcement admission plugin, as hardened clusters run it, so that the
# RBAC test sees what they see. Aggregator routing: webhooks and conversions that name a Service
# go to its endpoints, and no pod runs here, so the call fails at once instead of being sent to
# the Service's cluster IP or DNS name, which are not on this machine.
# The API server's memory limit: it keeps every object of a custom resource once per served
# version (Cluster API's claims and addresses serve three) plus the recent changes, and without a
# limit its Go heap doubles before it collects, and it keeps what it freed. Near 100,000 claims
# that outgrows this machine (BENCHMARKS.md); with the limit it collects harder instead.
# Shell builtins alone: this runs before the prerequisites are checked.
three_quarters_of_memory() {
  local key value _
  while read -r key value _; do
    if [ "$key" = MemTotal: ]; then
      echo "$((value * 3 / 4 / 1024))MiB"
      return
    fi
  done </proc/meminfo
}
APISERVER_MEMORY_LIMIT=${BITPOOL_APISERVER_MEMORY_LIMIT:-$(three_quarters_of_memory)}
PLANE_ID="$K8S_VERSION $ETCD_VERSION OwnerReferencesPermissionEnforcement aggregator-routing memory-limit=$APISERVER_MEMORY_LIMIT"
read -r -a APISERVER_ARGS <<<"${BITPOOL_APISERVER_ARGS:-}"
[ -z "${BITPOOL_APISERVER_ARGS:-}" ] || PLANE_ID="$PLANE_ID args=$BITPOOL_APISERVER_ARGS"
# The oldest Go that builds the pinned releases.
GO_MIN=1.26

die() { echo "control-plane: $*" >&2; exit 1; }
log() { echo "control-plane: $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

binaries_cached() {
  [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ] && [ -x "$ETCD_BIN" ]
}

go_ok() {
  command -v go >/dev/null 2>&1 || return 1
  local have
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$GO_MIN" "$have" | sort -V | head -n 1)" = "$GO_MIN" ]
}

# What the build and the running plane need; Debian packages are installed, Go is named.
ensure_prerequisites() {
  local missing=()
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v flock >/dev/null 2>&1 || missing+=(util-linux)
  if ! binaries_cached && ! go_ok; then
    die "missing prerequisite: Go $GO_MIN or newer on PATH (found: $(go env GOVERSION 2>/dev/null || echo none); Debian 12's golang packages are too old)${missing:+; also missing Debian packages: ${missing[*]}}"
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 ||
    die "missing prerequisites: ${missing[*]} (Debian packages), and there is no apt-get to install them"
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq || die "apt-get update failed; cannot install: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install failed for: ${missing[*]}"
}

# Go settings for every build: caches outside the checkout, the machine's own toolchain.
go_env() {
  export GOMODCACHE=$CACHE_DIR/go/mod GOCACHE=$CACHE_DIR/go/build GOFLAGS=-modcacherw GOTOOLCHAIN=local
}

# A scratch module in $1 that requires $2@$3.
scratch_module() {
  rm -rf "$1" && mkdir -p "$1"
  (cd "$1" && go mod init bitpool.test/build >/dev/null 2>&1 && go mod edit -require "$2@$3")
}

build_kubernetes() {
  local work=$CACHE_DIR/build/kubernetes minor patch
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  patch=$(echo "$K8S_VERSION" | cut -d. -f3)
  scratch_module "$work" k8s.io/kubernetes "$K8S_VERSION"
  cd "$work"
  go mod download k8s.io/kubernetes || die "cannot download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy"
  local upstream
  upstream=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  # k8s.io/kubernetes replaces its staging modules by local paths; use their published versions.
  local staging
  for staging in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$upstream/go.mod"); do
    go mod edit -replace "$staging=$staging@v0.$minor.$patch"
  done
  log "building kube-apiserver and kube-controller-manager $K8S_VERSION (about 10 minutes on 2 cores, once)"
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" >"$work/get.log" 2>&1 ||
    { tail -n 20 "$work/get.log" >&2; die "go get of the Kubernetes commands failed (log: $work/get.log)"; }
  local ldflags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  mkdir -p "$BIN_DIR"
  local cmd
  for cmd in kube-apiserver kube-controller-manager; do
    go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/$cmd" "k8s.io/kubernetes/cmd/$cmd" >"$work/$cmd.log" 2>&1 ||
      { tail -n 20 "$work/$cmd.log" >&2; die "building $cmd failed (log: $work/$cmd.log)"; }
  done
  cd - >/dev/null
}

build_etcd() {
  local work=$CACHE_DIR/build/etcd sibling
  scratch_module "$work" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
  cd "$work"
  # etcd's server module replaces its sibling modules by local paths; pin the same release.
  for sibling in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    go mod edit -replace "go.etcd.io/etcd/$sibling=go.etcd.io/etcd/$sibling@$ETCD_VERSION"
  done
  log "building etcd $ETCD_VERSION (about a minute, once)"
  { go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
    go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN" go.etcd.io/etcd/server/v3; } >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; die "building etcd failed (log: $work/build.log)"; }
  cd - >/dev/null
}

build() {
  if binaries_cached; then
    log "kube-apiserver, kube-controller-manager $K8S_VERSION and etcd $ETCD_VERSION are cached in $CACHE_DIR"
    return 0
  fi
  ensure_prerequisites
  go_env
  mkdir -p "$(dirname "$ETCD_BIN")"
  [ -x "$ETCD_BIN" ] || build_etcd
  { [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ]; } || build_kubernetes
  # The Go build cache is large and not needed again; the module cache serves later builds.
  chmod -R u+w "$CACHE_DIR/build" "$CACHE_DIR/go/build" 2>/dev/null || true
  rm -rf "$CACHE_DIR/build" "$CACHE_DIR/go/build"
  log "cached in $CACHE_DIR"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

running() {
  pid_alive "$STATE_DIR/etcd.pid" && pid_alive "$STATE_DIR/kube-apiserver.pid" &&
    pid_alive "$STATE_DIR/kube-controller-manager.pid"
}

wait_ready() {
  local what=$1 url=$2 deadline=$(($(date +%s) + $3))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if curl -s --cacert "$STATE_DIR/pki/ca.crt" --cert "$STATE_DIR/pki/admin.crt" --key "$STATE_DIR/pki/admin.key" \
      --max-time 2 "$url" 2>/dev/null | grep -q '^ok'; then
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

# kube-apiserver on the running etcd, with the plane's certificates; waits until it is ready.
start_apiserver() {
  local pki=$STATE_DIR/pki
  start_process kube-apiserver env GOMEMLIMIT="$APISERVER_MEMORY_LIMIT" "$BIN_DIR/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$API_PORT" \
    --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
    --tls-cert-file "$pki/serving.crt" --tls-private-key-file "$pki/serving.key" \
    --authorization-mode RBAC \
    --enable-admission-plugins OwnerReferencesPermissionEnforcement \
    --enable-aggregator-routing=true \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
    --client-ca-file "$pki/ca.crt" "${APISERVER_ARGS[@]}"
  if ! wait_ready kube-apiserver "https://127.0.0.1:$API_PORT/readyz" 60; then
    tail -n 20 "$STATE_DIR/kube-apiserver.log" >&2
    echo "control-plane: kube-apiserver did not become ready within 60 s (log: $STATE_DIR/kube-apiserver.log)" >&2
    return 1
  fi
}

# Stops kube-apiserver (SIGTERM, as an upgrade or a node drain does) and starts it again on the
# same etcd: every client's watch ends and relists.
restart_apiserver() {
  running || die "the control plane in $STATE_DIR is not running"
  # The ports it was brought up with, whatever this environment says.
  # shellcheck source=/dev/null
  . "$STATE_DIR/ports"
  stop_pid_file "$STATE_DIR/kube-apiserver.pid"
  # Down for a while, as in an upgrade: clients back off further between attempts.
  sleep "${1:-0}"
  start_apiserver || die "kube-apiserver did not come back"
  log "kube-apiserver restarted"
}

up() {
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/lock"
  flock -w 600 9 || die "another hack/control-plane.sh up holds $STATE_DIR/lock"
  if running && [ "$(cat "$STATE_DIR/version" 2>/dev/null)" = "$PLANE_ID" ]; then
    echo "$KUBECONFIG_PATH"
    return 0
  fi
  build
  ensure_prerequisites
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
  # The administrator's client certificate (group system:masters), for clients and the
  # controller manager alike.
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=admin" -keyout "$pki/admin.key" \
    -out "$pki/admin.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$pki/admin.ext"
  openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/admin.ext" -out "$pki/admin.crt" 2>/dev/null
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
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: bitpool-test
  context: {cluster: bitpool-test, user: admin, namespace: default}
current-context: bitpool-test
EOF

  start_process etcd "$ETCD_BIN" --name bitpool-test --data-dir "$STATE_DIR/etcd-data" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "bitpool-test=http://127.0.0.1:$ETCD_PEER_PORT"
  start_apiserver || { down_quiet; exit 1; }
  start_process kube-controller-manager "$BIN_DIR/kube-controller-manager" --kubeconfig "$KUBECONFIG_PATH" \
    --controllers namespace-controller,garbage-collector-controller,serviceaccount-token-controller \
    --leader-elect=false --secure-port 0 --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=false
  sleep 1
  pid_alive "$STATE_DIR/kube-controller-manager.pid" ||
    { tail -n 20 "$STATE_DIR/kube-controller-manager.log" >&2; down_quiet; die "kube-controller-manager exited at start"; }
  echo "$PLANE_ID" >"$STATE_DIR/version"
  printf 'API_PORT=%s\nETCD_PORT=%s\n' "$API_PORT" "$ETCD_PORT" >"$STATE_DIR/ports"
  log "ready (Kubernetes $K8S_VERSION, etcd $ETCD_VERSION): export KUBECONFIG=$KUBECONFIG_PATH"
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
  restart-apiserver) restart_apiserver "${2:-0}" ;;
  status) if running; then echo "running ($(cat "$STATE_DIR/version" 2>/dev/null || echo "unknown version")); KUBECONFIG=$KUBECONFIG_PATH"; else echo "not running"; exit 1; fi ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
