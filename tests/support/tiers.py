"""`requires(...)`: what a test needs, said at the test, in the spirit of Lightning's `RunIf`.

`@requires("torch")`, `pytestmark = requires("slurm")`, `@requires("root")`. A need is one of:
- a tier outside the Python process: the local SLURM cluster (`slurm/cluster/up.sh`), the real
  kube-apiserver (`k8s/apiserver/up.sh`), pods run by the operator harness, real pods on two
  kubelets (`k8s/kubelet/up.sh`), a GPU;
- `torch`: the test runs torch without its file importing it (it starts the trainer in a child
  process, or submits the built-in trainer, which refuses a python without torch). The
  torch-free sessions (`pytest --torch-free`) leave such tests out, and test files whose imports
  reach torch (support.torch_free);
- `root`: the test mounts, changes namespaces or otherwise needs uid 0.
Without it the test skips and says how to get it, except under CI (`CI` set, as `.ci/run` does),
where a missing need is a failure: CI brings them all up (and runs as root), so a silent one
means the set-up broke. A GPU is the one need CI never has, so it always skips.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from types import ModuleType

import pytest

from support.paths import REPO
from support.waiting import HUNG_S

TIERS = ("slurm", "apiserver", "pods", "realpods", "gpu")
# Needs that are not a cluster tier: a tier marker each too (`-m "not torch"`).
NEEDS = (*TIERS, "torch", "root")


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


@functools.cache
def _slurm() -> str | None:
    """None when sinfo shows the two usable nodes of slurm/cluster/up.sh."""
    hint = "; start it with: bash slurm/cluster/up.sh"
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return "SLURM's client commands (sinfo, sbatch) are not installed" + hint
    try:
        argv = ["sinfo", "--noheader", "--Node", "--format", "%N %t"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=HUNG_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo did not answer ({exc})" + hint
    if proc.returncode != 0:
        return f"sinfo failed: {proc.stderr.strip()[:300]}" + hint
    states = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    usable = {node for node, state in states if not re.search(r"down|drain|fail|unk|maint", state)}
    if len(usable) < 2:
        return f"fewer than 2 usable nodes: {proc.stdout.strip()!r}" + hint
    return None


def _apiserver() -> str | None:
    from support import apiserver_tier

    return None if apiserver_tier.kubeconfig_path() is not None else apiserver_tier.skip_reason()


def _pods() -> str | None:
    from support.operator_harness import available

    return available()


def _realpods() -> str | None:
    from support import realpods_tier

    return realpods_tier.missing()


@functools.cache
def _gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU on this machine"


def _torch() -> str | None:
    return None if importlib.util.find_spec("torch") is not None else "torch is not installed"


def _root() -> str | None:
    return None if os.geteuid() == 0 else "it runs as root (mounts, namespaces)"


_PROBES: dict[str, Callable[[], str | None]] = {
    "slurm": _slurm,
    "apiserver": _apiserver,
    "pods": _pods,
    "realpods": _realpods,
    "gpu": _gpu,
    "torch": _torch,
    "root": _root,
}


def missing(tier: str) -> str | None:
    """Why `tier` (any of NEEDS) is unavailable here, or None when it is there."""
    return _PROBES[tier]()


def requires(*tiers: str) -> pytest.MarkDecorator:
    """A mark for a test (or `pytestmark`) that needs these (NEEDS); each one's own marker is
    added, so `pytest -m 'not slurm'` still selects by tier."""
    unknown = set(tiers) - set(NEEDS)
    if unknown:
        raise ValueError(f"unknown need(s) {sorted(unknown)}; known: {NEEDS}")
    return pytest.mark.requires_tiers(*tiers)


def check(tiers: tuple[str, ...]) -> None:
    """Skip, or under CI fail, when one of `tiers` is missing (called by conftest per test)."""
    for tier in tiers:
        why = missing(tier)
        if why is None:
            continue
        if in_ci() and tier != "gpu":
            pytest.fail(f"the {tier} tier is missing under CI: {why}", pytrace=False)
        pytest.skip(f"needs the {tier} tier: {why}")


def require_tool(name: str) -> str:
    """The path of a tool the suite needs; under CI a missing tool is a failure, not a skip."""
    path = shutil.which(name)
    if path:
        return path
    if in_ci():
        pytest.fail(f"{name} is not installed; `make test` installs it", pytrace=False)
    pytest.skip(f"{name} is not installed (apt-get install {name})")
    raise AssertionError  # unreachable


def require_module(name: str, hint: str = "pip install -e '.[dev]'") -> ModuleType:
    """Import a Python dependency the suite needs (torch, kubernetes, submitit, ...): skip without
    it locally, fail under CI, where the dev environment has them all (pytest.importorskip would
    let a CI that lost one go green). Works at module level, as importorskip does."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if in_ci():
            pytest.fail(f"{name} cannot be imported under CI ({exc}); {hint}", pytrace=False)
        pytest.skip(f"{name} is not installed ({hint})", allow_module_level=True)
        raise AssertionError from exc  # unreachable


__all__ = ["NEEDS", "REPO", "TIERS", "check", "in_ci", "missing", "require_module", "require_tool", "requires"]
