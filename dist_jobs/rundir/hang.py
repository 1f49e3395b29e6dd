"""`<run dir>/HANG`: which rank's hang watchdog ended the run, at which step, when, in which attempt.

A watchdog exit and a preemption both end with the requeue code and the PREEMPTED marker the
batch script and the pod entrypoint turn into a requeue; this record is what tells them apart
for `dist-jobs status` ("hang (rank N)" instead of "preempted and checkpointed"). Every rank
whose steps stopped fires, within a check of each other: the first to write it is kept
(a hard link of a complete temporary file: atomic, and it fails when the record is there).
A record of an earlier attempt is replaced; rank 0 of a starting run removes it anyway.
Stdlib only: status reads it without torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from dist_jobs.constants import PREEMPTED_MARKER
from dist_jobs.rundir.atomic import write_atomic, write_new

HANG_RECORD = "HANG"


@dataclass(frozen=True)
class HangRecord:
    rank: int
    step: int | None = None  # the last optimizer step this rank completed
    time: float = 0.0  # wall clock (time.time()) of the firing
    attempt: int = 0  # 0 for a job's first start, n after n requeues (SLURM_RESTART_COUNT)
    job: str = ""  # the scheduler's job id ("<array>_<task>" for an array task), "" when unknown

    def told(self) -> str:
        """What status and the verdict say of this hang."""
        at = f" after step {self.step}" if self.step is not None else ""
        return f"no step completed{at} (rank {self.rank}'s watchdog fired)"

    def belongs_to(self, *, job: str | None = None, attempt: int | None = None, since: float | None = None) -> bool:
        """Whether this record is that attempt's: the same job and attempt, and not older than its start."""
        if job is not None and self.job and self.job != job:
            return False
        if attempt is not None and self.attempt != attempt:
            return False
        return since is None or self.time >= since


def job_id(environ: Mapping[str, str] | None = None) -> str:
    """This process's job as status names it: SLURM's id, an array task as `<array>_<task>`."""
    env = os.environ if environ is None else environ
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID", "") or env.get("DIST_JOBS_SUBMISSION", "")


def write_hang(folder: Path, record: HangRecord) -> None:
    """Leave `record` unless a rank of the same attempt already left one."""
    text = json.dumps(asdict(record), sort_keys=True) + "\n"
    if write_new(folder / HANG_RECORD, text):
        return
    there = read_hang(folder)
    if there is None or not there.belongs_to(job=record.job or None, attempt=record.attempt):
        write_atomic(folder / HANG_RECORD, text)  # an earlier attempt's (or unreadable): this attempt's wins


def write_preempted(folder: Path, why: str) -> None:
    """Leave the PREEMPTED marker: the run checkpointed (or hung) and asks to be requeued."""
    write_atomic(folder / PREEMPTED_MARKER, why + "\n")


def read_hang(folder: Path) -> HangRecord | None:
    """The record, or None when there is none or it cannot be read."""
    try:
        data = json.loads((folder / HANG_RECORD).read_text(encoding="utf-8"))
        step = data.get("step")
        return HangRecord(
            rank=int(data["rank"]),
            step=None if step is None else int(step),
            time=float(data.get("time", 0.0)),
            attempt=int(data.get("attempt", 0)),
            job=str(data.get("job", "")),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
