"""Where a local run lives is recorded once, at submit (dist_jobs.backends.records): `list` finds a
job wherever its checkpoint_dir put it, and a run the lock refused says why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import LockHeld, new_token
from dist_jobs.spec.load import load_spec
from support.lock_support import beating, foreign, plant
from support.waiting import eventually

pytestmark = [pytest.mark.timeout(120)]

QUICK = ["python3", "-c", "pass"]


def _submitted(workdir: Path, **spec: object) -> tuple[LocalBackend, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(workdir=workdir)
    job_spec = load_spec(data={"nodes": 1, "procs_per_node": 1, "command": QUICK, **spec})
    job_id = backend.schedule(backend.prepare(job_spec)).job_id
    eventually(lambda: backend.status(job_id).finished, timeout=60, what=f"job {job_id} to end")
    return backend, job_id


def test_list_shows_a_job_whose_checkpoint_dir_is_elsewhere_from_any_folder(tmp_path: Path) -> None:
    _, elsewhere = _submitted(tmp_path / "project", name="far", checkpoint_dir=str(tmp_path / "shared" / "ck"))
    _, beside = _submitted(tmp_path / "project", name="near")
    assert elsewhere == str((tmp_path / "shared" / "ck" / "far").resolve())
    for folder in (tmp_path / "project", tmp_path):  # where it was submitted, and anywhere else
        listed = LocalBackend(workdir=folder).list()
        assert [(s.job_id, s.state) for s in listed] == [(elsewhere, "COMPLETED"), (beside, "COMPLETED")]
        assert [s.handle for s in listed] == [f"local://{elsewhere}", f"local://{beside}"]


def test_a_run_the_lock_refused_says_why(tmp_path: Path) -> None:
    """A live run on another host (its heartbeat beats): only the launcher, watching it, can tell."""
    run_dir = tmp_path / "checkpoints" / "busy"
    holder = foreign("slurm:77", "slurm", "77")
    with beating(plant(run_dir, holder), holder):
        backend, job_id = _submitted(tmp_path, name="busy")
    status = backend.status(job_id)
    assert status.state == "FAILED"
    assert status.detail.startswith(f"run directory {run_dir.resolve()} is in use by another run (slurm job 77")
    assert status.detail.endswith("refusing to start a second run in it (exit 2)")


def test_a_run_a_live_process_here_holds_is_refused_at_submit(tmp_path: Path) -> None:
    """A live run on this machine (a foreground `dist-jobs run`): refused before anything starts."""
    run_dir = tmp_path / "checkpoints" / "busy"
    plant(run_dir, Holder.this(new_token(), "", "local", "", pid=os.getpid()))
    with pytest.raises(LockHeld) as caught:
        _submitted(tmp_path, name="busy")
    assert str(caught.value).startswith(f"run directory {run_dir} is in use by another run (local run, pid")
    assert not (run_dir / "local" / "pid").exists()
