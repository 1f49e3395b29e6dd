"""`<run dir>/result.json`: rank 0's final metrics, written once fit() ends, read by Job.result().

Written atomically (dist_jobs.rundir.atomic) so a reader never sees half a file. A JSON object of
the metrics ({name: float}) and `"stamp"`, the writing holder's lock stamp ("" without a lock;
absent in files of older versions). A result whose holder was superseded (its stamp retired in
metrics.jsonl, or not the stamp of the holder LOCK names) is a late write, not the run's result
(dist_jobs.rundir.stamps).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.progress import superseded
from dist_jobs.rundir.stamps import STAMP

RESULT = "result.json"


def write_result(run_dir: Path, metrics: Mapping[str, float], stamp: str = "") -> Path:
    text = json.dumps({**metrics, STAMP: stamp}, indent=2, sort_keys=True) + "\n"
    return write_atomic(run_dir / RESULT, text, mkdir=True)


def read_result(run_dir: Path) -> dict[str, float]:
    """The run's final metrics, without the stamp; DistJobsError when it has none (yet)."""
    path = run_dir / RESULT
    try:
        data = dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise DistJobsError(
            f"no result in {path}: the run has not finished fit() (or its trainer does not call fit())",
            "wait for the job to succeed (job.wait()), then ask again",
        ) from None
    stamp = data.pop(STAMP) if isinstance(data.get(STAMP), str) else ""  # a metric of that name stays
    if superseded(run_dir, stamp):
        raise DistJobsError(
            f"no result in {path}: the one there was written late by a run that had lost the run directory "
            "to another run",
            "wait for the run that holds the run directory now to finish fit(), then ask again",
        )
    return data
