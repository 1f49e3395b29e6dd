"""One vocabulary for every scheduler: JobState, and a process's end told in the verdict's words.

SLURM says COMPLETED, Kubernetes Succeeded, a local run exit 0: `normalise` maps each
scheduler's own word onto JobState, which the Python API and `dist-jobs status` show next to it.
"""

from __future__ import annotations

from enum import Enum

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.rundir.hang import HangRecord, describe_hang
from dist_jobs.rundir.verdict import Failure, signal_name


class JobState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"  # preempted, checkpointed or its node failed: waiting to run again
    COMPLETING = "completing"  # ended, its nodes not yet cleaned up: no rank is meant to run
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    def __str__(self) -> str:
        return self.value


_WORDS: dict[str, JobState] = {
    # SLURM (squeue and sacct)
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUED": JobState.REQUEUED,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.COMPLETING,  # slurm.faults says whether it was requeued
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.PENDING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,  # final only when it was not requeued (then it says REQUEUED)
    "CANCELLED": JobState.CANCELLED,
    # Kubernetes job conditions (PyTorchJob, TrainJob) and what dist-jobs says of a deleted job
    "CREATED": JobState.PENDING,
    "RESTARTING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "COMPLETE": JobState.SUCCEEDED,
    "TERMINATING": JobState.CANCELLED,
    "DELETED": JobState.CANCELLED,
}


def normalise(word: str) -> JobState:
    """The JobState of a scheduler's word (case and a trailing '+' or ' by 0' ignored)."""
    key = word.strip().split(" ")[0].rstrip("+").upper()
    return _WORDS.get(key, JobState.UNKNOWN)


def describe_exit(code: int | None, sig: int | None = None, *, hang: HangRecord | None = None) -> str:
    """A process's end in the verdict's words (dist_jobs.rundir.verdict.Failure): `exit 3`,
    `killed by SIGKILL (exit 137)`, `exit 200 (asked to run again)`; `hang: rank 3 on n2 stopped at
    step 812; the others wait in all_reduce (exit 200)` when the run directory's hang record
    (dist_jobs.rundir.hang, the caller checked it is this attempt's) says a watchdog ended it.
    Why a 200 was asked for (a preemption, a lost peer, a killed rank) is the verdict's to say."""
    if sig:
        return Failure(None, signal=signal_name(sig)).told()
    if code is None:
        return "no exit code"
    if code == REQUEUE_EXIT_CODE and hang is not None:
        return f"{describe_hang(hang)} (exit {code})"
    return Failure(None, code=code).told()
