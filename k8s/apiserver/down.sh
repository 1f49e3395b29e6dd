#!/usr/bin/env bash
# Stop the kube-apiserver + etcd that up.sh started and remove its state dir (etcd data, certs,
# kubeconfig, logs). The build cache (binary, Go cache, sources) is kept.
# Only pids recorded by up.sh are signalled, and only while they still run the expected binary.
set -euo pipefail

if [[ -n ${DIST_JOBS_APISERVER_STATE:-} ]]; then STATE=$DIST_JOBS_APISERVER_STATE
elif [[ -w /run ]]; then STATE=/run/dist-jobs-apiserver
else STATE=${XDG_RUNTIME_DIR:-/tmp}/dist-jobs-apiserver-$(id -u)
fi

log() { printf '[apiserver-down] %s\n' "$*" >&2; }

if [[ ! -d $STATE ]]; then log "nothing to do: $STATE does not exist"; exit 0; fi
# The marker guards the rm -rf below against a mistyped DIST_JOBS_APISERVER_STATE.
if [[ ! -f $STATE/.dist-jobs-apiserver ]]; then
  log "ERROR: $STATE was not created by up.sh (no .dist-jobs-apiserver marker); not touching it"
  exit 1
fi

stop() {  # stop NAME: TERM, wait up to 15 s, then KILL
  local name=$1 pid
  pid=$(cat "$STATE/$name.pid" 2>/dev/null) || return 0
  [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$name" || return 0
  log "stopping $name (pid $pid)"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 75); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  log "$name did not exit after 15 s; killing it"
  kill -9 "$pid" 2>/dev/null || true
}

# apiserver first: it would otherwise log etcd connection errors while shutting down.
stop kube-apiserver
stop etcd
rm -rf "$STATE"
log "stopped; removed $STATE"
