"""A local run refused the run directory's lock: refused at submit where that can be seen, and
otherwise recorded as refused (exit 2, and why) instead of "killed by SIGINT"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dist_jobs.backends.local import record
from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.backends.local.runner import LocalRunner
from dist_jobs.errors import UsageError
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import LOCK_NAME, LockHeld, acquire, new_token
from dist_jobs.spec import JobSpec
from dist_jobs.spec.load import load_spec


def spec(tmp_path: Path, **fields: object) -> JobSpec:
    data = {"name": "once", "procs_per_node": 1, "command": [sys.executable, "-c", "pass"], **fields}
    return load_spec(data={**data, "checkpoint_dir": str(tmp_path / "checkpoints")})


def held_by_this_process(run_dir: Path) -> Holder:
    """A foreground `dist-jobs run` of the same run, on this machine: this test's own process."""
    return acquire(run_dir, Holder.this(new_token(), "", "local", ""), stale_after=30).holder


def test_a_submit_of_a_run_a_live_process_here_holds_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "checkpoints" / "once"
    holder = held_by_this_process(run_dir)
    backend = LocalBackend(workdir=tmp_path, missing=lambda packages: [])
    with pytest.raises(LockHeld) as caught:
        backend.submit(spec(tmp_path))
    assert caught.value.exit_code == 2 and caught.value.holder == holder
    assert [p.name for p in (run_dir / record.FOLDER).iterdir()] == [record.CLAIM]  # no record, no launcher
    assert (run_dir / record.FOLDER / record.CLAIM).read_text() == ""  # the claim, released
    assert Holder.parse((run_dir / LOCK_NAME).read_bytes()) == holder


def test_a_launcher_refused_the_lock_records_why_not_sigint(tmp_path: Path) -> None:
    """The foreground run took the lock between the submit's look and its launcher's start."""
    run_dir = tmp_path / "checkpoints" / "once"
    held_by_this_process(run_dir)
    folder = run_dir / record.FOLDER
    folder.mkdir()
    (folder / record.PID).write_text("999999999\n")  # its launcher, ended
    (folder / record.SPEC).write_text("{}\n")
    with pytest.raises(LockHeld):
        record.run_recorded(spec(tmp_path), folder, LocalRunner(workdir=tmp_path))
    assert (folder / record.EXIT).read_text().strip() == "2"
    status = LocalBackend(workdir=tmp_path).status(str(run_dir))
    assert status.state == "FAILED"
    assert status.detail.startswith(f"run directory {run_dir} is in use by another run (local run, pid ")
    assert "SIGINT" not in status.detail


def test_lock_knobs_that_do_not_fit_together_are_refused_at_submit(tmp_path: Path) -> None:
    backend = LocalBackend(workdir=tmp_path, missing=lambda packages: [])
    knobs = {"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "40", "DIST_JOBS_LOCK_STALE_SECONDS": "90"}
    with pytest.raises(UsageError, match="DIST_JOBS_LOCK_HEARTBEAT_SECONDS=40 is more than a third of"):
        backend.submit(spec(tmp_path, env=knobs))
    assert not (tmp_path / "checkpoints").exists()
