"""Fixtures the cluster tests share."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    """SLURM job ids to scancel at the end of the test, whatever happened."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        subprocess.run(["scancel", job_id], capture_output=True)
