"""job.json: what `submit` recorded about a SLURM job in its job directory (`<jobs_dir>/<run>-<id>/`).

An array task `ID_I` of a sweep has no directory of its own: its record is the array's, with the
trial's run (`trials[I]`, written by `record_trials` right after the array was submitted) as
its run name and run directory, and the array's batch log `<array run>-ID_I.out` (`%x-%A_%a`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dist_jobs.backends import records
from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.slurm.squeue_sacct import SacctRow
from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.ledger import ledger
from dist_jobs.rundir.place import RunDir

JOB_JSON = "job.json"


def _record(jobs_dir: Path, job_id: str) -> Path | None:
    """job.json of `job_id`: in `jobs_dir`, else where this machine's record of submitted jobs
    (backends.records) says it was submitted to, so a job's record is found from any folder."""
    # a listing, not a glob: a glob compiles a pattern per job id, and a sweep's status asks for each trial
    try:
        names = sorted(n for n in os.listdir(jobs_dir) if n.endswith(f"-{job_id}"))
    except OSError:
        names = []
    found = (jobs_dir / n / JOB_JSON for n in names)
    here = next((p for p in found if p.is_file()), None)
    submitted = records.recorded("slurm", job_id) if here is None else None
    if submitted is None or not submitted.job_dir:
        return here
    path = Path(submitted.job_dir) / JOB_JSON
    return path if path.is_file() else None


def job_meta(jobs_dir: Path, job_id: str) -> dict[str, Any]:
    """job.json of a job submitted from here, or of the sweep trial `ID_I`; {} for others."""
    path = _record(jobs_dir, job_id)
    if path is not None:
        meta = dict(json.loads(path.read_text()))
        return {**meta, "batch_log": f"{meta.get('run', '')}-{job_id}.out"}
    array, sep, index = job_id.partition("_")
    path = _record(jobs_dir, array) if sep and index.isdigit() else None
    if path is None:
        return {}
    meta = dict(json.loads(path.read_text()))
    trials = meta.get("trials") or []
    if int(index) >= len(trials):
        return {}
    # the trial's run beside the array's, below the sweep's checkpoint root
    run_dir = RunDir.at(RunDir(Path(meta["run_dir"])).root, trials[int(index)]) if meta.get("run_dir") else None
    return {
        **meta,
        "run": trials[int(index)],
        "run_dir": str(run_dir) if run_dir else "",
        "batch_log": f"{meta.get('run', '')}-{job_id}.out",
    }


def record_trials(jobs_dir: Path, job_id: str, runs: Sequence[str]) -> None:
    """Name array task i's run `runs[i]` in the array's job.json (a sweep's trials)."""
    path = _record(jobs_dir, job_id)
    if path is None:
        return
    meta = json.loads(path.read_text())
    meta["trials"] = list(runs)
    write_atomic(path, json.dumps(meta, indent=2))


def array_task_key(rows: Sequence[SacctRow], job_id: str) -> str:
    """The id of the sacct record that holds array task `ID_I`: its own once it started, else the
    array's record of the tasks that never started (`ID_[2-5%2]`, pending or cancelled) listing I."""
    return array_member({r.job_id for r in rows if r.is_allocation}, job_id)


def array_member(ids: Iterable[str], job_id: str) -> str:
    """Of the ids squeue or sacct listed, the one that stands for array task `ID_I`: its own,
    else the array's record of tasks not started yet (`ID_[2-5%2]`) listing I; else `job_id`."""
    array, _, index = job_id.partition("_")
    ids = set(ids)
    if job_id in ids or not index.isdigit():
        return job_id
    for rid in sorted(ids):
        found = re.fullmatch(rf"{re.escape(array)}_\[([0-9,-]+)(?:%\d+)?\]", rid)
        if found and int(index) in _indices(found.group(1)):
            return rid
    return job_id


def _indices(ranges: str) -> set[int]:
    out: set[int] = set()
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            out.update(range(int(low), int(high or low) + 1))
    return out


def with_goodput(job_id: str, status: JobStatus, meta: dict[str, Any]) -> JobStatus:
    """The ledger of the job's run directory (its verdicts are recorded under the job id), from
    the submit time job.json recorded (local time, to the second) until it ended, or now."""
    run_dir, submitted = meta.get("run_dir"), meta.get("submitted_at")
    if not run_dir or "_" in job_id:  # an array task's verdicts are named by its own (raw) id
        return status
    try:
        since = time.mktime(time.strptime(str(submitted), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        since = None  # the first attempt's start, then
    found = ledger(Path(run_dir), job_id, since, time.time())
    return dataclasses.replace(status, goodput=found) if found is not None else status
