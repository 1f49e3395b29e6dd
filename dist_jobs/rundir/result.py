"""`<run dir>/result.json`: rank 0's final metrics, written once fit() ends, read by Job.result().

Written atomically (dist_jobs.rundir.atomic) so a reader never sees half a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.atomic import write_atomic

RESULT = "result.json"


def write_result(run_dir: Path, metrics: Mapping[str, float]) -> Path:
    return write_atomic(run_dir / RESULT, json.dumps(dict(metrics), indent=2, sort_keys=True) + "\n", mkdir=True)


def read_result(run_dir: Path) -> dict[str, float]:
    path = run_dir / RESULT
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise DistJobsError(
            f"no result in {path}: the run has not finished fit() (or its trainer does not call fit())",
            "wait for the job to succeed (job.wait()), then ask again",
        ) from None
