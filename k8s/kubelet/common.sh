# Shared by up.sh, down.sh and node.sh of the `realpods` tier (sourced, not run).
# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file
readonly K8S_VERSION=1.20.2
CACHE_ROOT=${DIST_JOBS_CACHE:-$HOME/.cache/dist-jobs}
KUBELET_BIN=$CACHE_ROOT/kubelet-v$K8S_VERSION/bin/kubelet
KUBECTL=$CACHE_ROOT/kube-apiserver-v$K8S_VERSION/bin/kubectl
STATE=${DIST_JOBS_PODS_STATE:-/run/dist-jobs-pods}
if [[ -n ${DIST_JOBS_APISERVER_STATE:-} ]]; then API_STATE=$DIST_JOBS_APISERVER_STATE
elif [[ -w /run ]]; then API_STATE=/run/dist-jobs-apiserver
else API_STATE=${XDG_RUNTIME_DIR:-/tmp}/dist-jobs-apiserver-$(id -u)
fi
API_PORT=${DIST_JOBS_APISERVER_PORT:-64430}
# The tier's own addresses: a bridge with the host at .1 and a node per namespace; pods get a
# subnet per node. Nothing else on the machine uses them.
BRIDGE=djkbr0
HOST_IP=10.78.0.1
# The apiserver's --service-cluster-ip-range and the `kubernetes` Service's ClusterIP in it.
SERVICE_CIDR=10.96.0.0/24
KUBERNETES_SERVICE_IP=10.96.0.1
IMAGE_NAME=localhost/dist-jobs-runtime
PAUSE_IMAGE=localhost/dist-jobs-pause:1
NAMESPACE=dist-jobs-pods  # the namespace the controller (the operator) watches
# apt waits for other installers instead of failing.
APT_OPTS=(-o DPkg::Lock::Timeout=600 -o APT::Lock::Timeout=600)

node_ip() { echo "10.78.0.1$1"; }
netns() { echo "djk-node$1"; }
veth() { echo "djkv$1"; }
pod_subnet() { echo "10.78.$(( $1 * 16 )).0/20"; }
cgroup_root() { echo "dist-jobs-node$1"; }
node_dir() { echo "$STATE/node$1"; }

cgroup_hierarchies() {  # every mounted cgroup hierarchy (v1 controllers and the unified one)
  awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts | sort -u
}

pid_is() {  # pid_is PIDFILE NAME: the recorded pid is alive and still runs NAME (no pid reuse)
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [[ -n $pid ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$2"
}

start_daemon() {  # start_daemon NAME LOG ARGS...: detached, without our descriptors, pid recorded
  local name=$1 logf=$2; shift 2
  (
    for fd in /proc/self/fd/*; do fd=${fd##*/}; (( fd > 2 )) && eval "exec $fd>&-"; done
    exec setsid "$@" >"$logf" 2>&1 </dev/null
  ) &
  echo "$!" >"$STATE/$name.pid"
}

api_get() {  # api_get PATH: GET against the apiserver with the admin token; prints the body
  curl -sf --max-time 5 --cacert "$API_STATE/pki/ca.crt" -H "Authorization: Bearer $(cat "$API_STATE/token")" \
    "https://127.0.0.1:$API_PORT$1"
}

node_ready() {  # node_ready N
  api_get "/api/v1/nodes/$(node_ip "$1")" 2>/dev/null | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}
