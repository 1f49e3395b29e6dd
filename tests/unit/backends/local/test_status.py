"""A local job's status from its folder (`<run_dir>/local/`), as the launcher leaves it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_jobs.backends.local import jobs
from dist_jobs.backends.local.jobs import LocalBackend


def _started(tmp_path: Path) -> Path:
    """A job whose launcher (pid 1 here, not a dist-jobs process) wrote no exit code yet."""
    run_dir = tmp_path / "checkpoints" / "run"
    (run_dir / "local").mkdir(parents=True)
    for name, text in (("pid", "1"), ("spec.yaml", "{}\n")):
        (run_dir / "local" / name).write_text(text)
    return run_dir


def test_a_launcher_gone_without_an_exit_code_reads_failed(tmp_path: Path) -> None:
    status = LocalBackend().status(str(_started(tmp_path)))
    assert (status.state, status.detail.split(";")[0]) == ("FAILED", "the launcher died without an exit code")


def test_a_job_that_ends_while_its_status_is_read_reads_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher writes its exit code and leaves between status's first read and its look at
    the process: the job completed, it did not die without a code (what `wait` would report)."""
    run_dir = _started(tmp_path)

    def ended_meanwhile(folder: Path) -> bool:
        (folder / "exit_code").write_text("0\n")
        return False

    monkeypatch.setattr(jobs, "alive", ended_meanwhile)
    status = LocalBackend().status(str(run_dir))
    assert (status.state, status.detail) == ("COMPLETED", "exit 0")
