"""A local job's status from its folder (`<run_dir>/local/`), as the launcher leaves it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dist_jobs.backends.local import jobs
from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.backends.local.record import Started
from support.lock_support import gone_launcher


def _started(tmp_path: Path, launcher: Started | None = None) -> Path:
    """A job whose launcher (`launcher`; default: one long gone) wrote no exit code yet."""
    run_dir = tmp_path / "checkpoints" / "run"
    (run_dir / "local").mkdir(parents=True)
    (run_dir / "local" / "spec.yaml").write_text("{}\n")
    (launcher or gone_launcher()).write(run_dir / "local" / "pid")
    return run_dir


def test_a_launcher_gone_without_an_exit_code_reads_failed(tmp_path: Path) -> None:
    status = LocalBackend().status(str(_started(tmp_path)))
    assert (status.state, status.detail.split(";")[0]) == ("FAILED", "the launcher died without an exit code")


def test_the_launcher_is_its_pid_and_start_time_whatever_its_command_line_reads(tmp_path: Path) -> None:
    """A launcher's command line reads empty while its exec is still under way (submit records
    its pid before then) and while it waits to be reaped: the record asks /proc for the pid's
    start time instead, so a launcher just started is running, and one that exited (reaped or
    a zombie) without an exit code died."""
    launcher = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    run_dir = _started(tmp_path, Started.of(launcher.pid))  # a command line without "dist_jobs"
    try:
        assert LocalBackend().status(str(run_dir)).state == "RUNNING"
    finally:
        assert launcher.stdin is not None
        launcher.stdin.close()
    os.waitid(os.P_PID, launcher.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
    assert LocalBackend().status(str(run_dir)).state == "FAILED"
    launcher.wait()
    assert LocalBackend().status(str(run_dir)).state == "FAILED"


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
