"""A finished SLURM job's status carries its goodput ledger, read from its run directory: the
verdicts recorded under its job id, and the submit time job.json recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

from dist_jobs.rundir.ledger import note
from dist_jobs.rundir.verdict import Action, Ending, Verdict, record

from .test_hang_status import _slurm_job


def test_a_finished_slurm_jobs_status_carries_its_ledger_from_the_submit_time_job_json_recorded(tmp_path: Path) -> None:
    backend, run_dir = _slurm_job(tmp_path)
    assert backend.status("104").goodput is None  # no trainer's record: nothing to tell
    meta_path = tmp_path / "runs" / "fx-requeues-used-up-104" / "job.json"
    submitted = time.mktime(time.strptime("2026-01-02T03:04:05", "%Y-%m-%dT%H:%M:%S"))
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "submitted_at": "2026-01-02T03:04:05"}))
    note(run_dir, "start", time=submitted + 60, attempt=0, job="104", resumed_step=0)
    note(run_dir, "first_step", time=submitted + 70, step=1)
    record(run_dir, "104", Verdict(Ending.PREEMPTED, Action.REQUEUE, 200, attempt="0", node="n1", time=submitted + 100))
    note(run_dir, "start", time=submitted + 160, attempt=1, job="104", resumed_step=0)
    record(run_dir, "104", Verdict(Ending.PREEMPTED, Action.FAIL, 200, attempt="1", node="n2", time=submitted + 180))
    ledger = backend.status("104").goodput
    assert ledger is not None and ledger.wall_s == 180.0 and ledger.queued_s == 60.0 + 60
    assert [(a.attempt, a.node) for a in ledger.attempts] == [("0", "n1"), ("1", "n2")]
    # attempt 0 saved nothing: its 30 s of steps are lost, and with the requeue and restart they cost 110 s
    assert ledger.told() == "goodput 0% (2 faults, 1m50s lost)"
