"""Shared test helpers: where the repo and the shared facts folder are."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
PYTHON = sys.executable


def require_tool(name: str) -> str:
    """The path of a tool the suite needs; in CI a missing tool is a failure, not a skip."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; .ci/run installs it")
    pytest.skip(f"{name} is not installed (apt-get install {name})")
    raise AssertionError  # unreachable


def venv_bin() -> Path:
    return Path(sys.executable).parent
