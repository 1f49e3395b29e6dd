"""`<run dir>/result.json`: rank 0's final metrics, written once fit() ends, read by Job.result().

Written atomically (temporary file, then rename) so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from dist_jobs.errors import DistJobsError

RESULT = "result.json"


def write_result(run_dir: Path, metrics: Mapping[str, float]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RESULT
    tmp = run_dir / f".{RESULT}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(dict(metrics), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_result(run_dir: Path) -> dict[str, float]:
    path = run_dir / RESULT
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise DistJobsError(
            f"no result in {path}: the run has not finished fit() (or its trainer does not call fit())",
            "wait for the job to succeed (job.wait()), then ask again",
        ) from None
