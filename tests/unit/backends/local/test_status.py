"""A local job's status from its folder (`<run_dir>/local/`), as the launcher leaves it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dist_jobs.backends.local import jobs
from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.backends.local.record import Started, launcher_pid
from dist_jobs.rundir.verdict import Evidence, Failure, decide, record
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


def _ended(tmp_path: Path, code: int) -> tuple[Path, str, float]:
    """A run whose launcher ended with `code`: its submission (the launcher's pid), and when it was submitted."""
    run_dir = _started(tmp_path)
    (run_dir / "local" / "exit_code").write_text(f"{code}\n")
    return run_dir, str(launcher_pid(run_dir / "local")), (run_dir / "local" / "pid").stat().st_mtime


def test_an_ended_run_reads_as_its_launchers_verdict_and_an_older_submissions_is_not_its_cause(tmp_path: Path) -> None:
    """Status tells the verdict the launcher recorded under its pid: a hang gives the run up
    (PREEMPTED, the hang's sentence), a bug fails it naming the rank; a verdict older than the
    submission (an earlier launcher that had the same pid) or of another exit code is not its end."""
    run_dir, pid, submitted = _ended(tmp_path, 200)
    hang = "hang: rank 1 on n0 stopped at step 6; the others wait in backward"
    older = decide(Evidence(3, (Failure(2, code=3),)))
    record(run_dir, pid, replace(older, time=submitted - 3600))
    status = LocalBackend().status(str(run_dir))
    assert (status.state, status.detail) == ("FAILED", "exit 200 (asked to run again)")  # no verdict of its own
    record(run_dir, pid, replace(decide(Evidence(200, (Failure(1, code=200),), hang=hang)), time=submitted + 1))
    status = LocalBackend().status(str(run_dir))
    assert (status.state, status.detail) == ("PREEMPTED", f"{hang}; to resume from the latest checkpoint (exit 200)")
    (run_dir / "local" / "exit_code").write_text("3\n")  # the verdict of a 200 is not a 3's
    assert LocalBackend().status(str(run_dir)).detail == "exit 3"
    record(run_dir, pid, replace(older, time=submitted + 2))
    status = LocalBackend().status(str(run_dir))
    assert (status.state, status.ranks) == ("FAILED", {2: "exit 3"})
    assert status.detail == "rank 2 failed first: exit 3; failed at once: the program's own error is not retried"
