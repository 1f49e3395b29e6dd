#!/usr/bin/env bash
# Build kubelet v1.20.2 from the same Debian `kubernetes` source package as the apiserver tier
# (k8s/apiserver/up.sh) and cache it. Debian ships no kubelet binary (no `kubernetes-node` in
# bookworm), but the source package holds the whole tree.
#
# The tree is prepared exactly like the apiserver's (reflect2 swap + k8s/apiserver/patches), plus
# k8s/kubelet/patches (the kubelet must not rewrite host sysctls). kube's build passes
# -trimpath=$KUBE_ROOT, so Go only reuses the apiserver's build cache when the tree sits at the
# very path the apiserver was built at: a private mount namespace binds a scratch tree there,
# invisible to everyone else (the apiserver's cache dir is not written, only its Go cache).
#
# Usage: build.sh  (prints nothing on stdout; the binary lands in $KUBELET_CACHE/bin/kubelet)
set -euo pipefail

readonly K8S_VERSION=1.20.2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROOT=${DIST_JOBS_CACHE:-$HOME/.cache/dist-jobs}
API_CACHE=$ROOT/kube-apiserver-v$K8S_VERSION
KCACHE=$ROOT/kubelet-v$K8S_VERSION
KUBELET_BIN=$KCACHE/bin/kubelet

log() { printf '[kubelet-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $1"; [[ -z ${2:-} ]] || log "hint: $2"; exit 1; }

# What the binary must be built from: both patch sets. Written beside the binary after a build.
patch_stamp() { cat "$REPO"/k8s/apiserver/patches/*.patch "$HERE"/patches/*.patch | sha256sum | cut -c1-16; }
binary_current() { [[ -x $KUBELET_BIN && $(cat "$KUBELET_BIN.patches" 2>/dev/null) == "$(patch_stamp)" ]]; }

tarball() { ls "$API_CACHE"/src/kubernetes_*.orig.tar.* 2>/dev/null | head -1; }

prepare_tree() {  # prepare_tree DIR: unpack, swap reflect2, patch; like the apiserver's up.sh
  local dir=$1 tree=$1/kubernetes-$K8S_VERSION r2 p
  rm -rf "$dir" && mkdir -p "$dir"
  tar xf "$(tarball)" -C "$dir"
  [[ -d $tree/cmd/kubelet ]] || die "unexpected source layout: cmd/kubelet missing"
  r2=$(dpkg -L golang-github-modern-go-reflect2-dev | grep -m1 '/reflect2/reflect2\.go$' | xargs dirname)
  rm -rf "$tree/vendor/github.com/modern-go/reflect2" && mkdir -p "$tree/vendor/github.com/modern-go/reflect2"
  cp "$r2"/*.go "$r2"/*.s "$tree/vendor/github.com/modern-go/reflect2/" 2>/dev/null \
    || cp "$r2"/*.go "$tree/vendor/github.com/modern-go/reflect2/"
  for p in "$REPO"/k8s/apiserver/patches/*.patch "$HERE"/patches/*.patch; do
    patch -d "$tree" -p1 --forward --quiet <"$p" >&2 || die "patch $p does not apply to v$K8S_VERSION"
  done
}

# Runs inside `unshare -m`: the scratch tree appears at the apiserver's build path.
in_namespace() {
  local scratch=$1 tree=$API_CACHE/src/kubernetes-$K8S_VERSION
  mount --bind "$scratch" "$API_CACHE/src"
  mkdir -p "$API_CACHE/gocache" "$tree/_output/local/go" && ln -sfn "$API_CACHE/gocache" "$tree/_output/local/go/cache"
  cd "$tree"
  nice -n 10 env CGO_ENABLED=0 GOPROXY=off KUBE_GIT_VERSION="v$K8S_VERSION" KUBE_GIT_TREE_STATE=clean \
    KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 make WHAT=cmd/kubelet
  mkdir -p "$KCACHE/bin" && cp _output/bin/kubelet "$KUBELET_BIN.new"
}

main() {
  if [[ ${1:-} == --in-namespace ]]; then in_namespace "$2"; return; fi
  binary_current && return
  # The apiserver tier fetches the source package (and fills the Go cache) on its first build.
  [[ -n $(tarball) ]] || bash "$REPO/k8s/apiserver/up.sh" --build-only
  [[ -n $(tarball) ]] || die "no kubernetes source tarball in $API_CACHE/src"
  local scratch=$KCACHE/build start rc=0
  mkdir -p "$KCACHE"
  prepare_tree "$scratch"
  start=$(date +%s)
  log "building kubelet v$K8S_VERSION (one-off; a few minutes with the apiserver's Go cache, log: $KCACHE/build.log)"
  unshare -m --propagation private bash "$HERE/build.sh" --in-namespace "$scratch" >"$KCACHE/build.log" 2>&1 || rc=$?
  rm -rf "$scratch"
  [[ $rc == 0 ]] || { tail -n 30 "$KCACHE/build.log" >&2; die "kubelet build failed (rc=$rc)" "see $KCACHE/build.log"; }
  mv "$KUBELET_BIN.new" "$KUBELET_BIN"
  patch_stamp >"$KUBELET_BIN.patches"
  log "built in $(( $(date +%s) - start )) s -> $KUBELET_BIN"
}

main "$@"; exit
