#!/usr/bin/env bash
# One node of the `realpods` tier: containerd + kubelet. up.sh runs it inside the node's network
# namespace and a private mount namespace, where the host paths both hard-code (/var/lib/kubelet,
# /var/log/pods, /run/containerd, /run/netns) are made private to this node.
# Usage: node.sh NODE_DIR NODE_IP KUBELET_BIN
set -euo pipefail
d=$1 ip=$2 kubelet=$3

# Writes under /var land in the node's own upper dir; nothing reaches the host's /var.
mount -t overlay overlay -o "lowerdir=/var,upperdir=$d/var-upper,workdir=$d/var-work" /var
mkdir -p /run/containerd /run/netns
mount -t tmpfs -o mode=0700 dist-jobs-containerd /run/containerd
mount -t tmpfs -o mode=0755 dist-jobs-netns /run/netns

containerd --config "$d/ctd/config.toml" >"$d/log/containerd.log" 2>&1 &
ctd=$!
echo "$ctd" >"$d/containerd.pid"
for _ in $(seq 100); do ctr -a "$d/ctd/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done

# The node is named by its IP: the apiserver reaches the kubelet (logs) by the node's name.
"$kubelet" --config "$d/kubelet.yaml" --kubeconfig "$d/kubeconfig" \
  --container-runtime remote --container-runtime-endpoint "unix://$d/ctd/containerd.sock" \
  --image-service-endpoint "unix://$d/ctd/containerd.sock" --runtime-request-timeout 2m \
  --cert-dir "$d/pki" --hostname-override "$ip" --node-ip "$ip" --v 1 >"$d/log/kubelet.log" 2>&1 &
kl=$!
echo "$kl" >"$d/kubelet.pid"
# Both are our children, so both are reaped; TERM stops the kubelet first, then containerd.
trap 'kill -TERM "$kl" 2>/dev/null; wait "$kl"; kill -TERM "$ctd" 2>/dev/null; wait "$ctd"; exit 0' TERM INT
wait -n "$kl" "$ctd" || true
echo "node.sh: kubelet or containerd exited" >&2
kill -TERM "$kl" "$ctd" 2>/dev/null || true
wait
exit 1
