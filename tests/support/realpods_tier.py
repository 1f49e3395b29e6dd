"""Helpers for the `realpods` test tier: real pods on two kubelet nodes (k8s/kubelet/up.sh).

up.sh leaves, in its state dir, the image reference it imported (`image.ref`), the kubeconfig of
the tier (`kubeconfig`) and the volumes it binds claims to (`volumes/<namespace>/<claim>`, the
same directory on both nodes and here, as an RWX filesystem would be).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from support.paths import REPO

UP_SCRIPT = "k8s/kubelet/up.sh"
NAMESPACE = "dist-jobs-pods"  # the namespace the tier's controller (the operator) watches
NODES = ("10.78.0.11", "10.78.0.12")


def tier_module(name: str) -> ModuleType:
    """k8s/kubelet/<name>.py (the tier's scripts are not a package), loaded once as `realpods_<name>`."""
    key = f"realpods_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "k8s" / "kubelet" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def state_dir() -> Path:
    return Path(os.environ.get("DIST_JOBS_PODS_STATE", "/run/dist-jobs-pods"))


def kubeconfig() -> Path:
    return state_dir() / "kubeconfig"


def image() -> str:
    return (state_dir() / "image.ref").read_text().strip()


def volume(claim: str) -> Path:
    """Where the controller puts the volume it binds `claim` to."""
    return state_dir() / "volumes" / NAMESPACE / claim


def _alive(pidfile: Path, name: str) -> bool:
    try:
        pid = pidfile.read_text().strip()
        return name in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


@functools.cache
def missing() -> str | None:
    """None when both nodes are Ready and the controller runs, else why not."""
    hint = f"; start it with: bash {UP_SCRIPT} (or make pods-up)"
    state = state_dir()
    if not (state / "image.ref").is_file() or not kubeconfig().is_file():
        return f"no realpods tier: {state}/image.ref or kubeconfig missing" + hint
    for pidfile, name in (("controller.pid", "controller.py"), ("node1.pid", "node.sh"), ("node2.pid", "node.sh")):
        if not _alive(state / pidfile, name):
            return f"the tier's {name} ({pidfile}) is not running" + hint
    try:
        from kubernetes import client, config

        with config.new_client_from_config(config_file=str(kubeconfig())) as api:
            for node in NODES:
                found = client.CoreV1Api(api).read_node(node, _request_timeout=5)
                ready = [c.status for c in found.status.conditions or [] if c.type == "Ready"]
                if ready != ["True"]:
                    return f"node {node} is not Ready ({ready})" + hint
    except Exception as exc:  # refused, TLS, 404: the tier is not usable
        return f"the tier's nodes do not answer: {type(exc).__name__}: {exc}"[:300] + hint
    return None
