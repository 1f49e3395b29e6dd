"""`requires(...)`: one gate for every test tier, in the spirit of Lightning's `RunIf`.

A tier is something outside the Python process a test needs: the local SLURM cluster
(`slurm/cluster/up.sh`), the real kube-apiserver (`k8s/apiserver/up.sh`), pods run by the
operator harness, real pods on two kubelets (`k8s/kubelet/up.sh`), a GPU, or a system tool.
Without it the test skips and says how to get it,
except under CI (`CI` set, as `.ci/run` does), where a missing cluster tier or tool is a
failure: CI brings them all up, so a silent one means the set-up broke. A GPU is the one tier
CI never has, so it always skips.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from types import ModuleType

import pytest

from support.paths import REPO

TIERS = ("slurm", "apiserver", "pods", "realpods", "gpu")


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
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20)
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


_PROBES: dict[str, Callable[[], str | None]] = {
    "slurm": _slurm,
    "apiserver": _apiserver,
    "pods": _pods,
    "realpods": _realpods,
    "gpu": _gpu,
}


def missing(tier: str) -> str | None:
    """Why `tier` is unavailable here, or None when it is up."""
    return _PROBES[tier]()


def requires(*tiers: str) -> pytest.MarkDecorator:
    """A mark for a test (or `pytestmark`) that needs these tiers; each tier's own marker is added,
    so `pytest -m 'not slurm'` still selects by tier."""
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tier(s) {sorted(unknown)}; known: {TIERS}")
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


__all__ = ["REPO", "TIERS", "check", "in_ci", "missing", "require_module", "require_tool", "requires"]
