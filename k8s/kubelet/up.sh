#!/usr/bin/env bash
# Bring up the `realpods` test tier on top of the apiserver tier (k8s/apiserver/up.sh): two
# Kubernetes nodes, each a kubelet v1.20.2 + containerd 1.6 in its own network namespace (own IP on
# a bridge) and its own private mount namespace, plus a controller that plays the Kubeflow training
# operator (and the control-plane loops this apiserver lacks) so that `dist-jobs submit --backend
# k8s` alone makes real pods run.
#
# Idempotent: a tier already up (both nodes Ready, controller alive) is a fast no-op. Prints, as
# its last line, the image reference the pods run (imported into both containerds, no registry).
# Stop it with down.sh, which leaves no process, link, mount, cgroup or API object behind.
#
# Environment (all optional):
#   DIST_JOBS_CACHE          cache root (kubelet binary; the apiserver's source + Go cache)  [~/.cache/dist-jobs]
#   DIST_JOBS_PODS_STATE     state dir: pids, logs, node data, volumes, kubeconfig   [/run/dist-jobs-pods]
#   DIST_JOBS_PODS_VENV      the venv the pods' python runs from (mounted read-only)  [<repo>/.venv]
#   DIST_JOBS_APISERVER_*    as for k8s/apiserver/up.sh (its state dir holds the admin kubeconfig)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=k8s/kubelet/common.sh
. "$HERE/common.sh"

log() { printf '[pods-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $1"; [[ -z ${2:-} ]] || log "hint: $2"; exit 1; }

# --- packages -------------------------------------------------------------------------------
ensure_packages() {
  local want=() cmd
  for cmd in containerd:containerd runc:runc ctr:containerd nsenter:util-linux ip:iproute2 busybox:busybox-static \
      iptables:iptables; do
    command -v "${cmd%%:*}" >/dev/null || want+=("${cmd#*:}")
  done
  [[ -x /usr/lib/cni/bridge ]] || want+=(containernetworking-plugins)
  if [[ ! -x $KUBELET_BIN ]]; then  # build.sh needs what the apiserver's build needs
    command -v go >/dev/null || want+=(golang-go)
    command -v patch >/dev/null || want+=(patch)
    command -v rsync >/dev/null || want+=(rsync)
    dpkg -s golang-github-modern-go-reflect2-dev >/dev/null 2>&1 || want+=(golang-github-modern-go-reflect2-dev)
  fi
  [[ ${#want[@]} == 0 ]] && return
  mapfile -t want < <(printf '%s\n' "${want[@]}" | sort -u)
  log "apt-get install ${want[*]}"
  local out; out=$(mktemp)
  { apt-get "${APT_OPTS[@]}" update -qq && DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y -qq \
      --no-install-recommends "${want[@]}"; } >"$out" 2>&1 || { cat "$out" >&2; rm -f "$out"; die "apt-get install failed"; }
  rm -f "$out"
}

pick_venv() {
  local venv=${DIST_JOBS_PODS_VENV:-$REPO/.venv}
  [[ -x $venv/bin/python ]] || die "no venv at $venv" "run 'make' (creates .venv) or set DIST_JOBS_PODS_VENV"
  venv=$(cd "$venv" && pwd)  # absolute: the pods mount it at the same path
  "$venv/bin/python" -c 'import torch, kubernetes' 2>/dev/null \
    || die "$venv has no torch or kubernetes" "pip install -e '.[train,dev]' into it"
  echo "$venv"
}

# --- the image: a busybox rootfs; python, torch and dist-jobs come from read-only mounts ------
build_image() {  # prints the image reference
  local venv=$1 base; base=$("$venv/bin/python" -c 'import sys; print(sys.base_prefix)')
  local ref img=$STATE/image
  rm -rf "$img" && mkdir -p "$img/rootfs"
  local r=$img/rootfs a
  mkdir -p "$r"/{bin,etc,tmp,root,proc,sys,dev,usr,run,var/tmp}
  chmod 1777 "$r/tmp" "$r/var/tmp"
  cp "$(command -v busybox)" "$r/bin/busybox"
  for a in $("$r/bin/busybox" --list); do [[ -e $r/bin/$a ]] || ln -s busybox "$r/bin/$a"; done
  # Merged /usr: the host's /usr (mounted over the image's) brings glibc and the loader.
  ln -s usr/lib "$r/lib"; ln -s usr/lib64 "$r/lib64"; ln -s usr/sbin "$r/sbin"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  # glibc resolves names from /etc/hosts (which the kubelet writes) first, as a distro image does.
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$r/etc/nsswitch.conf"
  # The image's environment, as a Dockerfile's ENV would set it: the venv's python first, and
  # this checkout's dist_jobs ahead of whatever the venv has installed.
  printf '%s\n' "PATH=$venv/bin:/bin:/usr/local/bin:/usr/bin:/usr/sbin:/sbin" "PYTHONPATH=$REPO" \
    "DIST_JOBS_PODS_MOUNTS=/usr:$base:$venv:$REPO" >"$img/env"
  local tag; tag=$( (cat "$img/env" "$r"/etc/*; find "$r" -printf '%P %l\n' | sort) | sha256sum | cut -c1-12)
  ref=$IMAGE_NAME:$tag
  "$venv/bin/python" "$HERE/mkimage.py" "$r" "$ref" "$img/image.tar" "$img/env" /bin/sh
  "$venv/bin/python" "$HERE/mkimage.py" "$r" "$PAUSE_IMAGE" "$img/pause.tar" /dev/null /bin/sleep 2147483647
  echo "$ref"
}

# --- network: a bridge on the host, one namespace per node ----------------------------------
make_network() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n
  for n in 1 2; do
    ip netns add "$(netns "$n")"
    ip link add "$(veth "$n")" type veth peer name eth0 netns "$(netns "$n")"
    ip link set "$(veth "$n")" master "$BRIDGE" up
    ip -n "$(netns "$n")" addr add "$(node_ip "$n")/24" dev eth0
    ip -n "$(netns "$n")" link set lo up
    ip -n "$(netns "$n")" link set eth0 up
    # Pods of the other node: routed through it (forwarding is per namespace; the host's stays off).
    ip -n "$(netns "$n")" route add "$(pod_subnet "$((3 - n))")" via "$(node_ip "$((3 - n))")"
    ip netns exec "$(netns "$n")" sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
    service_route "$n"
  done
}

# What kube-proxy does for the `kubernetes` Service: its ClusterIP:443 (KUBERNETES_SERVICE_HOST and
# _PORT in every pod) leads to the apiserver, here the relay on the host. The rules live in the
# node's namespace only. The pods' source is masqueraded to the node's address: the host has no
# route to the pod subnets.
service_route() {  # service_route N
  local n=$1 ns; ns=$(netns "$1")
  ip -n "$ns" route add "$SERVICE_CIDR" via "$HOST_IP"  # for the node's own (host-network) clients
  local chain
  for chain in PREROUTING OUTPUT; do
    ip netns exec "$ns" iptables -w -t nat -A "$chain" -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
      -j DNAT --to-destination "$HOST_IP:$API_PORT"
  done
  ip netns exec "$ns" iptables -w -t nat -A POSTROUTING -s "$(pod_subnet "$n")" -d "$HOST_IP/32" -j MASQUERADE
}

service_routed() {  # service_routed N: the rules of service_route are there (a tier from an older up.sh lacks them)
  ip netns exec "$(netns "$1")" iptables -w -t nat -C PREROUTING -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$HOST_IP:$API_PORT" 2>/dev/null
}

make_cgroups() {  # a cgroup root per node, so the two kubelets never touch each other's pods
  local n h
  for n in 1 2; do
    for h in $(cgroup_hierarchies); do
      mkdir -p "$h/$(cgroup_root "$n")"
      if [[ -f $h/cpuset.cpus ]]; then
        cat "$h/cpuset.cpus" >"$h/$(cgroup_root "$n")/cpuset.cpus"
        cat "$h/cpuset.mems" >"$h/$(cgroup_root "$n")/cpuset.mems"
      fi
    done
  done
}

write_node_files() {  # write_node_files N
  local n=$1 d; d=$(node_dir "$1")
  mkdir -p "$d"/{ctd,cni/net.d,cni/ipam,var-upper,var-work,log,pki}
  sed -e "s|@D@|$d|g" -e "s|@PAUSE@|$PAUSE_IMAGE|g" "$HERE/containerd.toml" >"$d/ctd/config.toml"
  sed -e "s|@SUBNET@|$(pod_subnet "$n")|g" -e "s|@D@|$d|g" "$HERE/cni.conflist" >"$d/cni/net.d/10-dist-jobs.conflist"
  sed -e "s|@IP@|$(node_ip "$n")|g" -e "s|@CGROOT@|/$(cgroup_root "$n")|g" "$HERE/kubelet.yaml" >"$d/kubelet.yaml"
  # The kubelet reaches the apiserver (loopback of the host) through relay.py on the
  # bridge; the server's certificate names localhost, hence tls-server-name.
  local ca; ca=$(base64 -w0 <"$API_STATE/pki/ca.crt")
  cat >"$d/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tier
  cluster: {server: "https://$HOST_IP:$API_PORT", certificate-authority-data: $ca, tls-server-name: localhost}
users:
- name: node
  user: {token: $(cat "$API_STATE/token")}
contexts:
- name: tier
  context: {cluster: tier, user: node}
current-context: tier
EOF
}

start_node() {  # start_node N: containerd + kubelet in the node's network and a private mount namespace
  local n=$1 d; d=$(node_dir "$1")
  start_daemon "node$n" "$d/log/node.log" nsenter --net="/run/netns/$(netns "$n")" -- \
    unshare -m --propagation private bash "$HERE/node.sh" "$d" "$(node_ip "$n")" "$KUBELET_BIN"
}

wait_nodes() {
  local deadline=$(( $(date +%s) + 120 )) n
  for n in 1 2; do
    until node_ready "$n"; do
      pid_is "$STATE/node$n.pid" node.sh || { tail -n 30 "$(node_dir "$n")/log/kubelet.log" >&2; die "node $n exited during start-up"; }
      (( $(date +%s) < deadline )) || { tail -n 30 "$(node_dir "$n")/log/kubelet.log" >&2; die "node $n not Ready after 120 s"; }
      sleep 1
    done
    log "node $(node_ip "$n") Ready"
  done
}

import_image() {  # import_image N TAR
  local sock; sock=$(node_dir "$1")/ctd/containerd.sock
  local deadline=$(( $(date +%s) + 60 ))
  until ctr -a "$sock" version >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || die "containerd of node $1 does not answer" "see $(node_dir "$1")/log/containerd.log"
    sleep 0.5
  done
  ctr -a "$sock" -n k8s.io images import --no-unpack=false "$2" >/dev/null
}

start_relay() {  # the kubelets' way to the apiserver, which listens on the host's loopback only
  start_daemon relay "$STATE/relay.log" "$1/bin/python" "$HERE/relay.py" "$HOST_IP:$API_PORT" "$API_PORT" "$STATE/relay.ready"
  local deadline=$(( $(date +%s) + 20 ))
  until [[ -f $STATE/relay.ready ]]; do
    pid_is "$STATE/relay.pid" relay.py || { tail -n 20 "$STATE/relay.log" >&2; die "relay exited"; }
    (( $(date +%s) < deadline )) || die "relay not ready after 20 s" "see $STATE/relay.log"
    sleep 0.2
  done
}

start_controller() {
  local venv=$1 image=$2
  start_daemon controller "$STATE/controller.log" "$venv/bin/python" "$HERE/controller.py" \
    --kubeconfig "$API_STATE/kubeconfig" --state "$STATE" \
    --nodes "$(node_ip 1),$(node_ip 2)" --mounts "$(sed -n 's/^DIST_JOBS_PODS_MOUNTS=//p' "$STATE/image/env")" \
    --root-ca "$API_STATE/pki/ca.crt"
  local deadline=$(( $(date +%s) + 30 ))
  until [[ -f $STATE/controller.ready ]]; do
    pid_is "$STATE/controller.pid" controller.py || { tail -n 20 "$STATE/controller.log" >&2; die "controller exited"; }
    (( $(date +%s) < deadline )) || die "controller not ready after 30 s" "see $STATE/controller.log"
    sleep 0.2
  done
  : "$image"
}

write_kubeconfig() {  # the admin kubeconfig with the tier's own context name
  sed -e 's/dist-jobs-apiserver$/dist-jobs-pods/' -e 's/name: dist-jobs-apiserver/name: dist-jobs-pods/' \
    -e 's/cluster: dist-jobs-apiserver/cluster: dist-jobs-pods/' "$API_STATE/kubeconfig" >"$STATE/kubeconfig.tmp"
  chmod 600 "$STATE/kubeconfig.tmp" && mv "$STATE/kubeconfig.tmp" "$STATE/kubeconfig"
}

tier_up() {  # tier_up VENV: up, and running this checkout's code from this venv
  [[ -f $STATE/image.ref && -f $STATE/kubeconfig ]] && [[ $(cat "$STATE/source" 2>/dev/null) == "$REPO $1" ]] \
    && pid_is "$STATE/controller.pid" controller.py \
    && pid_is "$STATE/relay.pid" relay.py \
    && pid_is "$STATE/node1.pid" node.sh && pid_is "$STATE/node2.pid" node.sh || return 1
  local n
  for n in 1 2; do
    node_ready "$n" && service_routed "$n" || return 1
  done
}

bring_up() {  # from nothing (a half-started tier is torn down first); prints the image reference
  local venv=$1 image start n; start=$(date +%s)
  [[ ! -e $STATE ]] || { log "tearing down the tier that is there (half-started, or from another checkout or venv)"; bash "$HERE/down.sh" >&2; }
  mkdir -p "$STATE" && chmod 755 "$STATE" && touch "$STATE/.dist-jobs-pods"
  echo "$venv/bin/python" >"$STATE/python"
  echo "$REPO $venv" >"$STATE/source"
  image=$(build_image "$venv")
  make_network
  make_cgroups
  write_kubeconfig
  start_relay "$venv"
  start_controller "$venv" "$image"
  for n in 1 2; do write_node_files "$n"; start_node "$n"; done
  for n in 1 2; do
    import_image "$n" "$STATE/image/pause.tar"
    import_image "$n" "$STATE/image/image.tar"
  done
  wait_nodes
  echo "$image" >"$STATE/image.ref"
  log "up in $(( $(date +%s) - start )) s: nodes $(node_ip 1) $(node_ip 2); kubeconfig $STATE/kubeconfig (context dist-jobs-pods)"
  log "kubectl: $KUBECTL --kubeconfig $STATE/kubeconfig get pods -o wide; stop: $HERE/down.sh"
  echo "$image"
}

api_ready() { [[ $(api_get /readyz 2>/dev/null) == ok ]]; }

main() {
  [[ $(id -u) == 0 ]] || die "the pods tier needs root (network namespaces, cgroups, containerd)"
  # The apiserver tier's own check has a short timeout; a loaded machine gets a few tries here.
  local _ venv
  for _ in 1 2 3 4 5; do api_ready && break; sleep 1; done
  api_ready || bash "$REPO/k8s/apiserver/up.sh" >&2
  venv=$(pick_venv)
  if tier_up "$venv"; then log "already running (state: $STATE)"; cat "$STATE/image.ref"; return; fi
  ensure_packages
  bash "$HERE/build.sh"
  # One retry from a clean slate: a start-up that fails on a loaded machine must not fail CI.
  # (A subshell in a statement of its own: inside `if`/`&&` bash would ignore set -e there.)
  local rc=0
  set +e; ( set -e; bring_up "$venv" ); rc=$?; set -e
  [[ $rc != 0 ]] || return 0
  log "start-up failed (logs above); tearing down and trying once more"
  bash "$HERE/down.sh" >&2
  bring_up "$venv"
}

main "$@"; exit  # exit here: an edit of this file while it runs must not be read on
