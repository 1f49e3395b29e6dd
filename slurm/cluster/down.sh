#!/usr/bin/env bash
# Tear down what slurm/cluster/up.sh started, and only that: the daemons, network namespaces,
# bridge and /etc/hosts lines recorded under /run/dist-jobs-slurm/. Packages, configs, the
# MariaDB data and slurmctld's saved state stay, so the next up.sh takes seconds.
#
# No `set -o pipefail` on purpose (see up.sh).
set -eu

STATE=/run/dist-jobs-slurm
# shellcheck source=slurm/cluster/lock.sh
. "$(dirname "$0")/lock.sh"
T0=$(date +%s%N)

log() {
  local d=$((($(date +%s%N) - T0) / 100000000))
  printf '[slurm-down %3d.%ds] %s\n' $((d / 10)) $((d % 10)) "$*"
}

# stop NAME COMM: stop the daemon whose pid up.sh recorded as NAME, if it still is COMM.
stop() {
  local f="$STATE/pids/$1.pid" pid comm
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || comm=""
  if [ "$comm" = "$2" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do
      [ -d "/proc/$pid" ] || break
      sleep 0.2
    done
    if [ -d "/proc/$pid" ]; then
      log "$1 (pid $pid) ignored SIGTERM for 30 s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

# netns_pids NAME: pids of every process inside network namespace NAME (job steps included:
# slurmstepd and its tasks inherit the node's namespace, so this finds exactly our jobs).
netns_pids() {
  local ino
  ino=$(stat -L -c %i "/run/netns/$1" 2>/dev/null) || return 0
  # One stat over all processes: a readlink per process is slow on a busy machine.
  stat -L -c '%i %n' /proc/[0-9]*/ns/net 2>/dev/null \
    | awk -v ino="$ino" '$1 == ino {split($2, p, "/"); print p[3]}'
  return 0
}

stop_netns_processes() {
  local ns pids
  [ -s "$STATE/netns" ] || return 0
  for ns in $(cat "$STATE/netns"); do
    pids=$(netns_pids "$ns")
    [ -n "$pids" ] || continue
    log "stopping $(echo $pids | wc -w) leftover process(es) in $ns (job steps)"
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 10); do
      [ -n "$(netns_pids "$ns")" ] || break
      sleep 0.2
    done
    pids=$(netns_pids "$ns")
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  done
}

remove_network() {
  local ns
  if [ -s "$STATE/netns" ]; then
    for ns in $(cat "$STATE/netns"); do
      ip netns del "$ns" 2>/dev/null || true
    done
    log "removed network namespaces: $(tr "\n" " " <"$STATE/netns")"
    rm -f "$STATE/netns"
  fi
  if [ -s "$STATE/bridge" ]; then
    ip link del "$(cat "$STATE/bridge")" 2>/dev/null || true
    log "removed bridge $(cat "$STATE/bridge")"
    rm -f "$STATE/bridge"
  fi
}

# /etc/hosts may be a bind mount: rewrite it in place, dropping exactly the lines we added.
remove_hosts() {
  local tmp
  [ -s "$STATE/hosts" ] || return 0
  tmp=$(mktemp)
  awk 'NR == FNR {ours[$0] = 1; next} !($0 in ours)' "$STATE/hosts" /etc/hosts >"$tmp"
  cat "$tmp" >/etc/hosts
  rm -f "$tmp" "$STATE/hosts"
  log "removed node lines from /etc/hosts"
}

# Jobs still running would otherwise come back as ghosts: slurmctld saves them as RUNNING and
# the next up.sh's nodes no longer have them. Once the slurmds are gone, setting the nodes DOWN
# ends those jobs as a real node crash would (NODE_FAIL, or requeued: batch jobs are requeuable
# by default). With a slurmd still alive, ReturnToService=2 would undo the DOWN at once.
busy_nodes() {
  [ -n "$1" ] && [ -n "$(timeout 10 squeue -h -t RUNNING,COMPLETING,CONFIGURING,SUSPENDED -w "$1" -o %i 2>/dev/null)" ]
}

fail_nodes() {
  log "setting nodes $1 DOWN so their jobs end (NODE_FAIL or requeued)"
  timeout 10 scontrol update NodeName="$1" State=DOWN Reason="dist-jobs down.sh" 2>/dev/null || true
}

# slurmd treats step sockets in its spool dir as live steps; those of killed steps must go.
remove_stale_sockets() {
  local node
  for node in $(echo "$1" | tr , ' '); do rm -f "/var/spool/slurmd/$node/${node}"_*; done
}

# our_nodes: comma-separated names of the nodes whose slurmd up.sh started.
our_nodes() {
  local f nodes=""
  for f in "$STATE"/pids/slurmd-*.pid; do
    [ -e "$f" ] || continue
    nodes="$nodes${nodes:+,}$(basename "$f" .pid | sed 's/^slurmd-//')"
  done
  echo "$nodes"
}

main() {
  local f name nodes busy
  [ "$(id -u)" = 0 ] || { echo "[slurm-down] ERROR: must run as root" >&2; exit 1; }
  lock slurm-down
  if [ ! -d "$STATE" ]; then
    log "nothing to tear down ($STATE does not exist)"
    return 0
  fi
  nodes=$(our_nodes) busy=""
  busy_nodes "$nodes" && busy=1
  log "stopping slurmd(s)"
  for f in "$STATE"/pids/slurmd-*.pid; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .pid)
    stop "$name" slurmd &
  done
  wait
  [ -z "$busy" ] || fail_nodes "$nodes"
  stop_netns_processes
  remove_stale_sockets "$nodes"
  log "stopping slurmctld"
  stop slurmctld slurmctld
  log "stopping slurmdbd"
  stop slurmdbd slurmdbd
  log "stopping MariaDB and munged"
  stop mariadbd mariadbd &
  stop munged munged &
  wait
  remove_network
  remove_hosts
  rmdir "$STATE/pids" 2>/dev/null || true
  rmdir "$STATE" 2>/dev/null || log "left $STATE in place: it holds files this script does not know"
  log "cluster down"
}

main "$@"
