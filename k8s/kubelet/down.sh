#!/usr/bin/env bash
# Stop the `realpods` tier that up.sh started and remove everything it made: the API objects
# (its namespace and all in it, its volumes, the nodes, their leases and events), the
# containers, containerd, the kubelets, the relay and the controller, the network namespaces and
# the bridge, the cgroups and the state dir. The kubelet binary stays cached; the apiserver tier
# is left running. Only pids recorded by up.sh (or found in the tier's own cgroups) are signalled.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=k8s/kubelet/common.sh
. "$HERE/common.sh"

log() { printf '[pods-down %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -e $STATE && ! -f $STATE/.dist-jobs-pods ]]; then
  log "ERROR: $STATE was not created by up.sh (no .dist-jobs-pods marker); not touching it"
  exit 1
fi

stop() {  # stop PIDFILE NAME [SECONDS]: TERM, wait, then KILL
  local pid
  pid_is "$1" "$2" || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq $(( ${3:-15} * 5 ))); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  log "$2 (pid $pid) did not exit; killing it"
  kill -9 "$pid" 2>/dev/null || true
}

python_for_api() {
  local py
  for py in "${DIST_JOBS_PODS_VENV:-$REPO/.venv}/bin/python" "$(cat "$STATE/python" 2>/dev/null)"; do
    [[ -x $py ]] && "$py" -c 'import kubernetes' 2>/dev/null && { echo "$py"; return; }
  done
}

api_cleanup() {  # api_cleanup PHASE
  local py; py=$(python_for_api)
  [[ -n $py && -f $API_STATE/kubeconfig ]] || { log "no apiserver kubeconfig or python: API objects not cleaned"; return; }
  "$py" "$HERE/controller.py" --kubeconfig "$API_STATE/kubeconfig" --state "$STATE" \
    --nodes "$(node_ip 1),$(node_ip 2)" --cleanup "$1" >&2 || log "warning: API cleanup ($1) failed"
}

kill_containers() {  # kill_containers N: every task of the node's containerd, then the containers
  local sock id; sock=$(node_dir "$1")/ctd/containerd.sock
  [[ -S $sock ]] || return 0
  for id in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io tasks rm -f "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io containers rm "$id" >/dev/null 2>&1 || true
  done
}

kill_leftovers() {  # processes in the nodes' cgroups, and containerd shims serving our sockets
  local n h pid
  for n in 1 2; do
    for h in $(cgroup_hierarchies); do
      [[ -d $h/$(cgroup_root "$n") ]] || continue
      find "$h/$(cgroup_root "$n")" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
        kill -9 "$pid" 2>/dev/null || true
      done
    done
  done
  local cmdline
  for cmdline in /proc/[0-9]*/cmdline; do
    if tr "\\0" " " 2>/dev/null <"$cmdline" | grep -q -- "containerd-shim.*$STATE/node"; then
      pid=${cmdline#/proc/}; kill -9 "${pid%/cmdline}" 2>/dev/null || true
    fi
  done
}

remove_cgroups() {
  local n h
  for n in 1 2; do
    for h in $(cgroup_hierarchies); do
      [[ -d $h/$(cgroup_root "$n") ]] || continue
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        find "$h/$(cgroup_root "$n")" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [[ -d $h/$(cgroup_root "$n") ]] || break
        sleep 0.5  # a process killed a moment ago leaves its cgroup once it is reaped
      done
      [[ ! -d $h/$(cgroup_root "$n") ]] || log "warning: could not remove $h/$(cgroup_root "$n")"
    done
  done
}

main() {
  stop "$STATE/controller.pid" controller.py
  # Pods first, while the kubelets still run and can stop their containers.
  api_cleanup pods
  local n
  for n in 1 2; do kill_containers "$n"; done
  for n in 1 2; do stop "$STATE/node$n.pid" node.sh 30; done
  kill_leftovers
  api_cleanup nodes
  stop "$STATE/relay.pid" relay.py
  for n in 1 2; do ip netns del "$(netns "$n")" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
  remove_cgroups
  rm -rf "$STATE"
  log "stopped; removed $STATE"
}

main "$@"; exit
