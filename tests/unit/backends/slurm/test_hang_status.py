"""Status tells a hang from a preemption: both end with exit 200 and the PREEMPTED marker (so the
job is requeued), but the hang watchdog also leaves <run dir>/HANG (dist_jobs.rundir.hang), and
status reads "hang (rank N)" when that record is the ended attempt's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.rundir.hang import HangRecord, StoppedRank, write_hang
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"


def test_describe_exit_names_the_hung_rank() -> None:
    assert describe_exit(200, hang=HangRecord(rank=1)) == "hang (rank 1) (exit 200)"  # an older record's
    assert describe_exit(200) == "exit 200 (asked to run again)"
    assert describe_exit(3, hang=HangRecord(rank=1)) == "exit 3"  # a record beside another exit is not its cause


class Sacct:
    """squeue has forgotten job 104; sacct answers from the captured file."""

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 1, "", (FIXTURES / "squeue_err_unknown_job.txt").read_text())
        return subprocess.CompletedProcess(argv, 0, (FIXTURES / "sacct_requeues_used_up.txt").read_text(), "")


def _slurm_job(tmp_path: Path) -> tuple[SlurmBackend, Path]:
    """Job 104 as `submit` leaves its job directory; its real batch log: two attempts, both exit 200."""
    run, run_dir = "fx-requeues-used-up", tmp_path / "ckpt" / "fx-requeues-used-up"
    run_dir.mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{run}-104.out").write_text((FIXTURES / "batchlog_requeues_used_up.txt").read_text())
    folder = tmp_path / "runs" / f"{run}-104"
    folder.mkdir(parents=True)
    meta = {"job_id": "104", "run": run, "log_dir": str(tmp_path / "logs"), "run_dir": str(run_dir)}
    (folder / "job.json").write_text(json.dumps(meta))
    return SlurmBackend(runner=Sacct(), jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c"), run_dir


def test_a_slurm_job_whose_last_attempt_hung_reads_hang_and_not_for_another_attempt_or_job(tmp_path: Path) -> None:
    backend, run_dir = _slurm_job(tmp_path)
    assert backend.status("104").detail == "preempted with the requeues used up (1 of 1)"
    for attempt, job in ((0, "104"), (1, "99")):  # the batch log's last attempt is 1, of job 104
        write_hang(run_dir, HangRecord(rank=2, step=40, time=time.time(), attempt=attempt, job=job))
        assert backend.status("104").detail == "preempted with the requeues used up (1 of 1)"
        os.unlink(run_dir / "HANG")
    write_hang(run_dir, HangRecord(rank=2, step=40, time=time.time(), attempt=1, job="104"))
    status = backend.status("104")
    assert (status.state, status.detail) == ("FAILED", "hang (rank 2) (exit 200); the requeues are used up (1 of 1)")
    os.unlink(run_dir / "HANG")  # a record that names the rank that stopped: its sentence
    stopped = (StoppedRank(rank=3, host="n2", step=40),)
    write_hang(run_dir, HangRecord(2, 40, time.time(), 1, "104", "n1", stopped, "all_reduce", 4))
    assert backend.status("104").detail == (
        "hang: rank 3 on n2 stopped at step 40; the others wait in all_reduce (exit 200); "
        "the requeues are used up (1 of 1)"
    )
