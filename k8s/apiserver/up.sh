#!/usr/bin/env bash
# Bring up a real kube-apiserver v1.20.2 + etcd on loopback for the `apiserver` test tier.
#
# Debian ships no kube-apiserver binary, but its `kubernetes` source package holds the whole tree
# (vendor/ included), so we build cmd/kube-apiserver once with Debian's Go and cache it.
# The source gets the patches in patches/ (kubernetes#99804: empty strings in custom resources);
# a cached binary built without exactly these patches is rebuilt, and a running server started
# from another build is restarted. Installs the PyTorchJob, TrainJob and JobSet CRDs of k8s/crds/.
# Idempotent: an apiserver already answering makes this a fast no-op. Stop it with down.sh.
#
#   up.sh --build-only   build (or rebuild) the cached binary and exit; a running server is untouched
#
# Environment (all optional):
#   DIST_JOBS_CACHE            cache root (binary, Go build cache, source tarball)  [~/.cache/dist-jobs]
#   DIST_JOBS_APISERVER_STATE  state dir: pids, logs, etcd data, certs, kubeconfig
#                              [/run/dist-jobs-apiserver, or $XDG_RUNTIME_DIR|/tmp/dist-jobs-apiserver-UID]
#   DIST_JOBS_APISERVER_PORT   secure port of kube-apiserver on 127.0.0.1                [64430]
#   DIST_JOBS_ETCD_PORT        etcd client port on 127.0.0.1                            [23790]
#   DIST_JOBS_ETCD_PEER_PORT   etcd peer port on 127.0.0.1                              [23800]
#   DIST_JOBS_APISERVER_TOKEN  static bearer token of the admin user                     [dist-jobs-admin]
#   DIST_JOBS_PYTHON           python with the `kubernetes` client   [<repo>/.venv/bin/python or python3]
set -euo pipefail

readonly K8S_VERSION=1.20.2
readonly SRC_PKG=kubernetes
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${DIST_JOBS_CACHE:-$HOME/.cache/dist-jobs}/kube-apiserver-v$K8S_VERSION
if [[ -n ${DIST_JOBS_APISERVER_STATE:-} ]]; then STATE=$DIST_JOBS_APISERVER_STATE
elif [[ -w /run ]]; then STATE=/run/dist-jobs-apiserver
else STATE=${XDG_RUNTIME_DIR:-/tmp}/dist-jobs-apiserver-$(id -u)
fi
API_PORT=${DIST_JOBS_APISERVER_PORT:-64430}
ETCD_PORT=${DIST_JOBS_ETCD_PORT:-23790}
ETCD_PEER_PORT=${DIST_JOBS_ETCD_PEER_PORT:-23800}
TOKEN=${DIST_JOBS_APISERVER_TOKEN:-dist-jobs-admin}
APISERVER_BIN=$CACHE/bin/kube-apiserver
KUBECTL_BIN=$CACHE/bin/kubectl
PATCHES=$HERE/patches
CRD_FILES=(kubeflow.org_pytorchjobs.yaml trainer.kubeflow.org_trainjobs.yaml jobset.x-k8s.io_jobsets.yaml)
CRD_NAMES=(pytorchjobs.kubeflow.org trainjobs.trainer.kubeflow.org jobsets.jobset.x-k8s.io)
STAGE_RE='^(\+\+\+ |    (\./|cmd/))'
# apt waits for other installers instead of failing (other helpers may be running apt too).
APT_OPTS=(-o DPkg::Lock::Timeout=600 -o APT::Lock::Timeout=600)
SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo

log() { printf '[apiserver-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $1"; [[ -z ${2:-} ]] || log "hint: $2"; exit 1; }

pick_python() {
  local py
  for py in "${DIST_JOBS_PYTHON:-}" "$REPO/.venv/bin/python" python3; do
    [[ -n $py ]] && command -v "$py" >/dev/null 2>&1 && "$py" -c 'import kubernetes' 2>/dev/null \
      && { echo "$py"; return; }
  done
  die "no python with the 'kubernetes' client found" "pip install kubernetes, or set DIST_JOBS_PYTHON"
}

# --- fast path ------------------------------------------------------------------------------
pid_is() {  # pid_is PIDFILE NAME: the recorded pid is alive and still runs NAME (no pid reuse)
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"
}

api_get() {  # api_get PATH: GET against our apiserver with the static token; prints the body
  curl -sf --max-time 3 --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $(cat "$STATE/token")" \
    "https://127.0.0.1:$API_PORT$1"
}

# What the binary must be built from: the patches' contents. Written beside the binary after a
# build and into the state dir when a server starts, so a stale binary or server is noticed.
patch_stamp() { cat "$PATCHES"/*.patch | sha256sum | cut -c1-16; }

# The apiserver's flags. A server started with other flags (an older up.sh) is restarted.
# * 1.20 only accepts --insecure-port=0.
# * RBAC: a pod's ServiceAccount token gets what its Roles grant; the admin token (system:masters)
#   keeps everything, and every client of the tier (kubelets, controller, tests) uses it. No Node
#   authorizer: no kubelet authenticates as a system:node user here, it would decide nothing.
# * BoundServiceAccountTokenVolume (alpha in 1.20, on by default from 1.21): the ServiceAccount
#   admission plugin mounts a projected volume (a TokenRequest token, the kube-root-ca.crt
#   ConfigMap, the namespace) as current clusters do; without it 1.20 wants a token Secret that
#   only kube-controller-manager's token controller makes.
# * --endpoint-reconciler-type none: the default one logs every 10 s that 127.0.0.1 is loopback.
APISERVER_ARGS=(
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" --bind-address 127.0.0.1 --advertise-address 127.0.0.1
  --secure-port "$API_PORT" --insecure-port 0 --tls-cert-file "$STATE/pki/server.crt"
  --tls-private-key-file "$STATE/pki/server.key" --token-auth-file "$STATE/tokens.csv"
  --authorization-mode RBAC --feature-gates BoundServiceAccountTokenVolume=true
  --service-account-issuer https://kubernetes.default.svc.cluster.local
  --service-account-key-file "$STATE/pki/sa.pub" --service-account-signing-key-file "$STATE/pki/sa.key"
  --service-cluster-ip-range 10.96.0.0/24 --enable-priority-and-fairness=false --v 1
  --endpoint-reconciler-type none
)
args_stamp() { printf '%s\n' "${APISERVER_ARGS[@]}" | sha256sum | cut -c1-16; }

binary_current() { [[ -x $APISERVER_BIN && $(cat "$APISERVER_BIN.patches" 2>/dev/null) == "$(patch_stamp)" ]]; }

servers_up() {
  [[ -f $STATE/kubeconfig ]] && pid_is "$STATE/etcd.pid" etcd && pid_is "$STATE/kube-apiserver.pid" kube-apiserver \
    && [[ $(cat "$STATE/kube-apiserver.patches" 2>/dev/null) == "$(patch_stamp)" ]] \
    && [[ $(cat "$STATE/kube-apiserver.args" 2>/dev/null) == "$(args_stamp)" ]] && server_cert_current \
    && [[ $(api_get /readyz 2>/dev/null) == ok ]]
}

crds_established() {
  local name
  for name in "${CRD_NAMES[@]}"; do
    api_get "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" 2>/dev/null \
      | tr -d ' \n' | grep -q '"type":"Established","status":"True"' || return 1
  done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- packages -------------------------------------------------------------------------------
apt_updated=0
apt_update_once() {
  [[ $apt_updated == 1 ]] && return
  log "apt-get update"
  $SUDO apt-get "${APT_OPTS[@]}" update -qq >&2 || die "apt-get update failed" "check the network/mirror in /etc/apt"
  apt_updated=1
}

ensure_packages() {
  local want=()
  command -v etcd >/dev/null || want+=(etcd-server)
  command -v curl >/dev/null || want+=(curl)
  command -v openssl >/dev/null || want+=(openssl)
  if ! binary_current; then
    command -v go >/dev/null || want+=(golang-go)
    command -v patch >/dev/null || want+=(patch)
    command -v rsync >/dev/null || want+=(rsync)  # kube's hack/ scripts place binaries with rsync
    dpkg -s golang-github-modern-go-reflect2-dev >/dev/null 2>&1 || want+=(golang-github-modern-go-reflect2-dev)
  fi
  [[ ${#want[@]} == 0 ]] && return
  apt_update_once
  log "apt-get install ${want[*]}"
  local out; out=$(mktemp)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends \
    "${want[@]}" >"$out" 2>&1 || { cat "$out" >&2; rm -f "$out"; die "apt-get install ${want[*]} failed"; }
  rm -f "$out"
}

# kubectl 1.20 matches the server's version. The Debian package `kubernetes-client` would clash
# with any kubectl already owning /usr/bin/kubectl (e.g. the Google Cloud SDK one), so we only
# download the .deb and unpack the binary into the cache. Optional: a failure is just a warning.
ensure_kubectl() {
  [[ -x $KUBECTL_BIN ]] && return
  apt_update_once
  local tmp; tmp=$(mktemp -d)
  local sandbox=(); [[ $(id -u) != 0 ]] || sandbox=(-o APT::Sandbox::User=root)  # _apt can't write $tmp
  if (cd "$tmp" && apt-get "${APT_OPTS[@]}" "${sandbox[@]}" download -qq kubernetes-client >&2) \
      && dpkg-deb -x "$tmp"/kubernetes-client_*.deb "$tmp/x" && [[ -x $tmp/x/usr/bin/kubectl ]]; then
    mkdir -p "$CACHE/bin" && cp "$tmp/x/usr/bin/kubectl" "$KUBECTL_BIN"
    log "kubectl $("$KUBECTL_BIN" version --client --short 2>/dev/null || true) cached at $KUBECTL_BIN"
  else
    log "warning: could not fetch Debian's kubernetes-client; kubectl 1.20 not cached (not needed by tests)"
  fi
  rm -rf "$tmp"
}

# --- source + build -------------------------------------------------------------------------
# Print "URI SUITE COMPONENTS SIGNED-BY" for every active Debian `deb` entry of this release,
# reading both the one-line format and deb822 (*.sources) files.
debian_deb_entries() {
  local codename; codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  local files=(); local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  [[ ${#files[@]} == 0 ]] && return
  awk -v cn="$codename" '
    FNR == 1 { flush() }
    function flush(  n, i, s) {
      if (types ~ /(^| )deb( |$)/ && enabled != "no") {
        n = split(suites, s, " ")
        for (i = 1; i <= n; i++) if (s[i] ~ ("^" cn "(-updates|-security)?$"))
          { split(uris, u, " "); print u[1], s[i], comps, (signed == "" ? "-" : signed) }
      }
      types = uris = suites = comps = signed = enabled = ""
    }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[ \t]*$/) { flush(); next }
      if ($0 ~ /^#/) next
      key = tolower($1); sub(/:$/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val)
      if (key == "types") types = val; else if (key == "uris") uris = val
      else if (key == "suites") suites = val; else if (key == "components") comps = val
      else if (key == "signed-by") signed = val; else if (key == "enabled") enabled = tolower(val)
      next
    }
    /^[ \t]*deb[ \t]/ {
      signed = ""; line = $0
      if (match(line, /\[[^]]*\]/)) {
        opts = substr(line, RSTART + 1, RLENGTH - 2); line = substr(line, 1, RSTART - 1) substr(line, RSTART + RLENGTH)
        if (match(opts, /signed-by=[^ ]+/)) signed = substr(opts, RSTART + 10, RLENGTH - 10)
      }
      n = split(line, w, /[ \t]+/); c = ""
      for (i = 4; i <= n; i++) c = c (c == "" ? "" : " ") w[i]
      if (w[3] ~ ("^" cn "(-updates|-security)?$")) print w[2], w[3], c, (signed == "" ? "-" : signed)
    }
    END { flush() }
  ' "${files[@]}"
}

# `apt-get source` with a private deb-src list + private lists dir, so /etc/apt stays untouched.
fetch_source() {
  ls "$CACHE"/src/"${SRC_PKG}"_*.orig.tar.* >/dev/null 2>&1 && return
  local apt_dir=$CACHE/aptsrc entries
  entries=$(debian_deb_entries)
  [[ -n $entries ]] || die "no Debian 'deb' entry for this release found under /etc/apt" \
    "add the Debian mirror to /etc/apt/sources.list(.d) or fetch the '$SRC_PKG' source package by hand into $CACHE/src"
  mkdir -p "$apt_dir/lists/partial" "$CACHE/src"
  while read -r uri suite comps signed; do
    if [[ $signed == - ]]; then echo "deb-src $uri $suite $comps"
    else echo "deb-src [signed-by=$signed] $uri $suite $comps"; fi
  done <<<"$entries" >"$apt_dir/src.list"
  log "private deb-src list: $(tr '\n' ';' <"$apt_dir/src.list")"
  local o=(-o "Dir::Etc::sourcelist=$apt_dir/src.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$apt_dir/lists")
  # The cache sits in $HOME, which apt's '_apt' download user usually cannot write to.
  [[ $(id -u) != 0 ]] || o+=(-o APT::Sandbox::User=root)
  apt-get "${APT_OPTS[@]}" "${o[@]}" update -qq >&2
  log "downloading Debian source package '$SRC_PKG' (~35 MB)"
  (cd "$CACHE/src" && apt-get "${APT_OPTS[@]}" "${o[@]}" source --download-only -qq "$SRC_PKG" >&2)
}

prepare_tree() {  # unpack + swap reflect2; prints the tree path
  local tree=$CACHE/src/kubernetes-$K8S_VERSION
  rm -rf "$tree"
  tar xf "$(ls "$CACHE"/src/"${SRC_PKG}"_*.orig.tar.* | head -1)" -C "$CACHE/src"
  [[ -d $tree/cmd/kube-apiserver ]] || die "unexpected source layout: $tree/cmd/kube-apiserver missing"
  # The vendored reflect2 v1.0.1 crashes with Go >= 1.18; Debian's 1.0.2 is API-compatible.
  local r2; r2=$(dpkg -L golang-github-modern-go-reflect2-dev | grep -m1 '/reflect2/reflect2\.go$' | xargs dirname)
  rm -rf "$tree/vendor/github.com/modern-go/reflect2" && mkdir -p "$tree/vendor/github.com/modern-go/reflect2"
  cp "$r2"/*.go "$r2"/*.s "$tree/vendor/github.com/modern-go/reflect2/" 2>/dev/null \
    || cp "$r2"/*.go "$tree/vendor/github.com/modern-go/reflect2/"
  local p
  for p in "$PATCHES"/*.patch; do
    patch -d "$tree" -p1 --forward --quiet <"$p" >&2 || die "patch $p does not apply to v$K8S_VERSION"
  done
  echo "$tree"
}

show_stages() {  # print the build's new stage lines ("+++ Building go targets ...") once each
  local seen n
  seen=$(cat "$CACHE/.stages-shown" 2>/dev/null || echo 0)
  n=$(grep -cE "$STAGE_RE" "$CACHE/build.log" 2>/dev/null || true)
  (( ${n:-0} > seen )) || return 0
  grep -E "$STAGE_RE" "$CACHE/build.log" | sed -n "$((seen + 1)),${n}p" | sed 's/^/    /' >&2
  echo "$n" >"$CACHE/.stages-shown"
}

heartbeat() {  # progress while the (mostly silent) build runs: stages live, elapsed every minute
  local start=$1 i=0
  while sleep 10; do
    show_stages
    (( ++i % 6 == 0 )) || continue
    log "  ... building, $(( ($(date +%s) - start) / 60 )) min elapsed, Go build cache $(du -sh "$CACHE/gocache" 2>/dev/null | cut -f1)"
  done
}

build_apiserver() {
  binary_current && return
  [[ -x $APISERVER_BIN ]] && log "cached $APISERVER_BIN was not built with the patches in $PATCHES: rebuilding"
  fetch_source
  local tree start rc=0
  tree=$(prepare_tree)
  start=$(date +%s)
  # kube's hack/lib/golang.sh forces GOCACHE=_output/local/go/cache; point that at the cache dir.
  mkdir -p "$CACHE/gocache" "$tree/_output/local/go" && ln -sfn "$CACHE/gocache" "$tree/_output/local/go/cache"
  echo 0 >"$CACHE/.stages-shown"
  log "building kube-apiserver v$K8S_VERSION (one-off; ~6-12 min on 2 cores, log: $CACHE/build.log)"
  heartbeat "$start" & HEARTBEAT=$!
  # nice: the build must not starve whatever else runs on this machine. KUBE_GIT_* give the
  # binary a real version (the tarball has no .git).
  (cd "$tree" && nice -n 10 env CGO_ENABLED=0 GOPROXY=off \
      KUBE_GIT_VERSION="v$K8S_VERSION" KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
      make WHAT=cmd/kube-apiserver >"$CACHE/build.log" 2>&1) || rc=$?
  kill "$HEARTBEAT" 2>/dev/null; wait "$HEARTBEAT" 2>/dev/null || true; HEARTBEAT=""
  show_stages
  [[ $rc == 0 ]] || { tail -n 30 "$CACHE/build.log" >&2; die "kube-apiserver build failed (rc=$rc)" "see $CACHE/build.log"; }
  mkdir -p "$CACHE/bin" && cp "$tree/_output/bin/kube-apiserver" "$APISERVER_BIN.new" && mv "$APISERVER_BIN.new" "$APISERVER_BIN"
  patch_stamp >"$APISERVER_BIN.patches"
  log "built in $(( $(date +%s) - start )) s -> $APISERVER_BIN"
  rm -rf "$tree"  # ~1 GB; the tarball + Go build cache make a rebuild cheap
}

# --- run ------------------------------------------------------------------------------------
stop_leftovers() {  # a half-dead previous run (e.g. apiserver crashed): stop what we recorded
  local name pid
  for name in kube-apiserver etcd; do
    if pid_is "$STATE/$name.pid" "$name"; then
      pid=$(cat "$STATE/$name.pid"); log "stopping stale $name (pid $pid)"; kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/$name.pid"
  done
}

# The `kubernetes` Service's ClusterIP (first address of --service-cluster-ip-range): the address
# the kubelet gives pods as KUBERNETES_SERVICE_HOST; in-cluster clients verify it in the certificate.
readonly CLUSTER_IP=10.96.0.1
SERVER_SANS="IP:127.0.0.1,IP:$CLUSTER_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"

server_cert_current() {  # the serving certificate names the ClusterIP (PKIs made before it did not)
  openssl x509 -in "$STATE/pki/server.crt" -noout -ext subjectAltName 2>/dev/null | grep -q "IP Address:$CLUSTER_IP\b"
}

make_pki() {  # own CA so clients verify TLS instead of skipping it
  local p=$STATE/pki
  # Python 3.13's default TLS context checks strictly (VERIFY_X509_STRICT): a CA without a key
  # usage extension is refused, so a PKI made before it had one is made again. A serving
  # certificate without the ClusterIP is made again from the same CA (kubeconfigs stay valid).
  if ! { [[ -f $p/server.crt ]] && openssl x509 -in "$p/ca.crt" -noout -ext keyUsage 2>/dev/null | grep -q 'Certificate Sign'; }; then
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=dist-jobs-apiserver-ca \
      -addext 'keyUsage=critical,keyCertSign,cRLSign' -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
    rm -f "$p/server.crt"
  fi
  if [[ ! -f $p/server.crt ]] || ! server_cert_current; then
    openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$p/server.key" -out "$p/server.csr" 2>/dev/null
    printf '%s\n' "subjectAltName=$SERVER_SANS" \
      'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' >"$p/ext"
    openssl x509 -req -in "$p/server.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
      -extfile "$p/ext" -out "$p/server.crt" 2>/dev/null
  fi
  [[ -f $p/sa.key ]] || { openssl genrsa -out "$p/sa.key" 2048 2>/dev/null && openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null; }
}

wait_for() {  # wait_for SECONDS DESCRIPTION PIDFILE NAME LOG COMMAND...
  local secs=$1 what=$2 pidf=$3 name=$4 logf=$5; shift 5
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    pid_is "$pidf" "$name" || { tail -n 20 "$logf" >&2; die "$what exited during start-up" "see $logf"; }
    (( $(date +%s) < deadline )) || { tail -n 20 "$logf" >&2; die "$what not ready after ${secs}s" "see $logf"; }
    sleep 0.5
  done
}

etcd_healthy() { curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
api_ready() { [[ $(api_get /readyz) == ok ]]; }

start_daemon() {  # start_daemon NAME LOG ARGS...: detached from this shell, pid recorded
  local name=$1 logf=$2; shift 2
  # Without the descriptors this shell inherited: a daemon keeping, say, the lock file of a
  # `flock LOCK up.sh` open would hold that lock for as long as it runs.
  (
    for fd in /proc/self/fd/*; do fd=${fd##*/}; (( fd > 2 )) && eval "exec $fd>&-"; done
    exec setsid "$@" >"$logf" 2>&1 </dev/null
  ) &
  local pid=$!
  echo "$pid" >"$STATE/$name.pid"
  # Until its exec the child is still this script, and pid_is would call a slow start a crash.
  for _ in $(seq 200); do
    if pid_is "$STATE/$name.pid" "$name" || ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.05
  done
}

start_servers() {
  local p
  for p in "$API_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    port_free "$p" || die "port 127.0.0.1:$p is taken by something up.sh did not start" \
      "stop it, or choose other ports with DIST_JOBS_APISERVER_PORT / DIST_JOBS_ETCD_PORT / DIST_JOBS_ETCD_PEER_PORT"
  done
  # One member: no peer to heartbeat, but raft ticks at the heartbeat interval all the same (100 ms
  # by default), a steady load on a small test machine; the election timeout keeps its 10x.
  start_daemon etcd "$STATE/etcd.log" etcd --name default --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" \
    --heartbeat-interval 500 --election-timeout 5000
  wait_for 30 etcd "$STATE/etcd.pid" etcd "$STATE/etcd.log" etcd_healthy
  log "etcd ready on 127.0.0.1:$ETCD_PORT"
  start_daemon kube-apiserver "$STATE/kube-apiserver.log" "$APISERVER_BIN" "${APISERVER_ARGS[@]}"
  wait_for 90 kube-apiserver "$STATE/kube-apiserver.pid" kube-apiserver "$STATE/kube-apiserver.log" api_ready
  patch_stamp >"$STATE/kube-apiserver.patches"
  args_stamp >"$STATE/kube-apiserver.args"
  log "kube-apiserver ready on https://127.0.0.1:$API_PORT"
}

write_kubeconfig() {
  local ca; ca=$(base64 -w0 <"$STATE/pki/ca.crt")
  cat >"$STATE/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dist-jobs-apiserver
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $ca
users:
- name: dist-jobs-admin
  user:
    token: $TOKEN
contexts:
- name: dist-jobs-apiserver
  context: {cluster: dist-jobs-apiserver, user: dist-jobs-admin, namespace: default}
current-context: dist-jobs-apiserver
EOF
  chmod 600 "$STATE/kubeconfig.tmp" && mv "$STATE/kubeconfig.tmp" "$STATE/kubeconfig"
}

report() {
  echo "kube-apiserver v$K8S_VERSION is up: https://127.0.0.1:$API_PORT (CRDs ${CRD_NAMES[*]} established)"
  echo "kubeconfig: $STATE/kubeconfig"
  echo "  export DIST_JOBS_KUBECONFIG=$STATE/kubeconfig KUBECONFIG=$STATE/kubeconfig"
  [[ -x $KUBECTL_BIN ]] && echo "kubectl 1.20: $KUBECTL_BIN --kubeconfig $STATE/kubeconfig get pytorchjobs"
  echo "stop: $HERE/down.sh"
}

install_crds() {
  local files=() f
  for f in "${CRD_FILES[@]}"; do
    [[ -f $REPO/k8s/crds/$f ]] || die "CRD $f not found" "expected k8s/crds/$f in the repo"
    files+=("$REPO/k8s/crds/$f")
  done
  local py; py=$(pick_python) || exit 1  # die in $(...) ends only the subshell
  "$py" "$HERE/install_crd.py" --kubeconfig "$STATE/kubeconfig" "${files[@]}" >&2
}

main() {
  trap '[[ -z ${HEARTBEAT:-} ]] || kill "$HEARTBEAT" 2>/dev/null' EXIT
  if [[ ${1:-} == --build-only ]]; then
    ensure_packages; build_apiserver; log "binary current: $APISERVER_BIN"; return
  fi
  if servers_up; then
    log "already running (state: $STATE)"
    crds_established || install_crds
    report; return
  fi
  ensure_packages
  build_apiserver
  ensure_kubectl
  mkdir -p "$STATE" && chmod 700 "$STATE" && touch "$STATE/.dist-jobs-apiserver"
  stop_leftovers
  make_pki
  printf '%s\n' "$TOKEN" >"$STATE/token"
  printf '%s,dist-jobs-admin,dist-jobs-admin,system:masters\n' "$TOKEN" >"$STATE/tokens.csv"
  start_servers
  write_kubeconfig
  install_crds
  report
}

main "$@"; exit  # exit here: an edit of this file while it runs must not be read on
