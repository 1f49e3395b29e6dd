"""Fixtures the integration tests share."""

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


@pytest.fixture
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """fit() in this process as a single-process run: no launcher's or scheduler's variables."""
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "DIST_JOBS_CHECKPOINT_DIR",
        "DIST_JOBS_RUN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DIST_JOBS_ENV", "single")
