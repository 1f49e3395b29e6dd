"""Read a manifest as kubectl does, offline: Go's YAML 1.1 reader (sigs.k8s.io/yaml on yaml.v2).

PyYAML resolves fewer YAML 1.1 booleans than Go's yaml.v2 (not `y`, `Y`, `n`, `N`), so a
manifest PyYAML reads right can still reach the cluster changed. `kubectl annotate --local -f -
-o json` decodes the manifest with kubectl's own reader, needs no server, and prints JSON.
kubectl 1.20 is the one k8s/apiserver/up.sh caches; any kubectl on PATH does too.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from support.tiers import in_ci
from support.waiting import HUNG_S

_MARK = "dist-jobs.test/read-back"


@functools.cache
def kubectl_binary() -> str | None:
    cache = Path(os.environ.get("DIST_JOBS_CACHE", Path.home() / ".cache" / "dist-jobs"))
    cached = cache / "kube-apiserver-v1.20.2" / "bin" / "kubectl"
    return str(cached) if cached.exists() else shutil.which("kubectl")


def require_kubectl() -> str:
    found = kubectl_binary()
    if found:
        return found
    if in_ci():
        pytest.fail("no kubectl under CI: k8s/apiserver/up.sh caches kubectl 1.20", pytrace=False)
    pytest.skip("no kubectl: k8s/apiserver/up.sh caches kubectl 1.20 (or put one on PATH)")
    raise AssertionError  # unreachable


class KubectlRefused(Exception):
    """kubectl could not read the manifest (its message is the exception's text)."""


def read_like_kubectl(manifest: str) -> dict[str, Any]:
    """The object kubectl reads from `manifest`; KubectlRefused when it cannot read it."""
    with tempfile.TemporaryDirectory() as home:  # no kubeconfig, no cache: nothing but the reader
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
        argv = [require_kubectl(), "annotate", "--local", "-f", "-", "-o", "json", f"{_MARK}=1"]
        proc = subprocess.run(argv, input=manifest, capture_output=True, text=True, env=env, timeout=HUNG_S)
    if proc.returncode != 0:
        raise KubectlRefused(proc.stderr.strip())
    obj: dict[str, Any] = json.loads(proc.stdout)
    annotations = obj["metadata"].pop("annotations")
    del annotations[_MARK]
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj
