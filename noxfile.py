"""The test matrix: every Python that pyproject's classifiers promise (`make test` runs `nox`).

- `full`: the whole suite (trainer, SLURM cluster, apiserver tiers) in the Makefile's venv, on
  the Python the pinned torch has wheels for (TORCH_PYTHONS).
- `torch_free-3.X`: on every other promised Python, a fresh venv with dist-jobs and the test tools
  but no torch, running every test that needs no torch (`pytest --torch-free`, tests/conftest.py):
  spec, render, CLI, backends with captured scheduler output, the real apiserver tier; on all
  but the newest of them, the unit tests only (WHOLE_SET_PYTHON). The SLURM
  cluster and operator-harness tiers run jobs of the built-in trainer, so they run in `full` only.

Interpreters are found on PATH (`python3.X`); where pyenv manages them, the newest installed
3.X of `pyenv versions` is made visible to its shims. A promised Python that cannot be found fails
the run instead of being skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox

REPO = Path(__file__).resolve().parent
# The pinned torch (Makefile TORCH_PINS) has wheels here for these only; the others would each
# download several GB of CUDA wheels.
TORCH_PYTHONS = ["3.11"]


def _minor(version: str) -> int:
    return int(version.split(".")[1])


PYTHONS = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', (REPO / "pyproject.toml").read_text())
TORCH_FREE_PYTHONS = [v for v in PYTHONS if v not in TORCH_PYTHONS]
# The newest of them also runs the torch-free integration tests (the CLI and local launches in
# subprocesses, the wheel, the apiserver tier), as the full session does on its Python; the others
# run the unit tests, which import and exercise every module (an older Python's missing stdlib
# name or syntax fails there). The integration tests drive that same code through subprocesses: a
# third and fourth time they cost CPU the suite's budget lacks (README, Tests).
WHOLE_SET_PYTHON = max(TORCH_FREE_PYTHONS, key=_minor)

nox.options.sessions = ["full", *(f"torch_free-{v}" for v in TORCH_FREE_PYTHONS)]
nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "venv"


def _expose_pyenv_versions(wanted: list[str]) -> None:
    """Let pyenv's `python3.X` shims resolve for every wanted 3.X that pyenv has installed."""
    if not shutil.which("pyenv"):
        return
    bare = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True, check=False).stdout
    installed = bare.split()
    chosen = []
    for minor in wanted:
        patches = [v for v in installed if re.fullmatch(rf"{re.escape(minor)}\.\d+", v)]
        if patches:
            chosen.append(max(patches, key=lambda v: int(v.rsplit(".", 1)[1])))
    current = subprocess.run(["pyenv", "version-name"], capture_output=True, text=True, check=False).stdout.strip()
    # The current version stays first, so a plain `python3` still means what it meant.
    versions = [v for v in dict.fromkeys([*current.split(":"), *chosen]) if v]
    os.environ["PYENV_VERSION"] = ":".join(versions)


_expose_pyenv_versions(PYTHONS)


# pytest-xdist workers per session (DIST_JOBS_TEST_WORKERS overrides both). Most of the full
# session's time is waiting (cluster jobs, process start-up, deadlines), so it runs more workers than
# the machine has cores; each cluster tier's tests still run on one worker (tests/conftest.py).
# The figures behind these numbers are in the README's Tests section.
FULL_WORKERS = os.environ.get("DIST_JOBS_TEST_WORKERS", "3")
TORCH_FREE_WORKERS = os.environ.get("DIST_JOBS_TEST_WORKERS", "2")
# The share of each property test's examples the torch-free sessions try (tests/support/props.py).
PROPERTY_SHARE = "0.1"


@nox.session(venv_backend="none")
def full(session: nox.Session) -> None:
    """The whole suite in the Makefile's venv (DIST_JOBS_VENV, default .venv)."""
    python = REPO / os.environ.get("DIST_JOBS_VENV", ".venv") / "bin" / "python"
    xdist = ["-n", FULL_WORKERS, "--dist", "loadgroup"]
    # pytest's 5 (no test collected, e.g. a -m selection that matches none) is not a failure here.
    session.run(str(python), "-m", "pytest", "-q", *xdist, *session.posargs, success_codes=[0, 5])


@nox.session(python=TORCH_FREE_PYTHONS)
def torch_free(session: nox.Session) -> None:
    """Every test that needs no torch, on a venv without it."""
    session.install("-q", "-e", ".[test]")
    # The SLURM cluster's, the operator harness's and the real pods' jobs run the trainer.
    tiers = "not slurm and not pods and not realpods and not gpu"
    xdist = ["-n", TORCH_FREE_WORKERS, "--dist", "loadgroup"]
    tests = [] if session.python == WHOLE_SET_PYTHON else ["tests/unit"]
    argv = ["python", "-m", "pytest", "-q", *xdist, "--torch-free", "-m", tiers, *tests, *session.posargs]
    # Each property runs here to prove the code on this Python; the full session does the search.
    session.run(*argv, success_codes=[0, 5], env={"DIST_JOBS_PROPERTY_SHARE": PROPERTY_SHARE})
