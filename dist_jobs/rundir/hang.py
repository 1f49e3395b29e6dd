"""`<run dir>/HANG`: which rank's hang watchdog ended the run, at which step, when, in which attempt,
and which rank(s) it found had stopped (dist_jobs.rundir.beats): the ranks waiting for a stopped
one in a collective are the ones whose watchdogs fire, so the firing rank is rarely the culprit.

A watchdog exit and a preemption both end with the requeue code and the PREEMPTED marker the
batch script and the pod entrypoint turn into a requeue; this record is what tells them apart
for `dist-jobs status` ("hang (rank N)" instead of "preempted and checkpointed"). Every rank
whose steps stopped fires, within a check of each other: the first to write it is kept
(a hard link of a complete temporary file: atomic, and it fails when the record is there).
A record of an earlier attempt is replaced; rank 0 of a starting run removes it anyway.
`describe_hang()` is the one sentence every backend's status shows for it. Records of older
versions (no `stopped`, `compared` 0) read as before: "hang (rank N)".

Both carry the writing holder's lock stamp (dist_jobs.rundir.stamps): the marker is the JSON object
`{"why": ..., "stamp": ..., "time": ...}` (why: the step checkpointed, or the hang's sentence; an
older version's marker is that text alone, and still reads), the record a `stamp` field. Whether
one is the reader's attempt's is `preempted_since()` and `attempt_hang()`: never when its stamp is
another holder's than the lock the attempt holds (a superseded holder's late write), else when it
is not older than the attempt's start. Stdlib only: status reads it without torch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from dist_jobs.constants import PREEMPTED_MARKER
from dist_jobs.rundir.atomic import write_atomic, write_new
from dist_jobs.rundir.stamps import STAMP, holder_stamp, stamp_in, this_attempts

HANG_RECORD = "HANG"


@dataclass(frozen=True)
class StoppedRank:
    rank: int
    host: str = ""
    step: int | None = None  # the last optimizer step it completed


@dataclass(frozen=True)
class HangRecord:
    rank: int  # the rank whose watchdog fired (and wrote this)
    step: int | None = None  # the last optimizer step this rank completed
    time: float = 0.0  # wall clock (time.time()) of the firing
    attempt: int = 0  # 0 for a job's first start, n after n requeues (SLURM_RESTART_COUNT)
    job: str = ""  # the scheduler's job id ("<array>_<task>" for an array task), "" when unknown
    host: str = ""  # the firing rank's
    stopped: tuple[StoppedRank, ...] = ()  # the ranks that stopped before the others
    others: str = ""  # what the other ranks wait in ("all_reduce"), "" when unknown
    compared: int = 0  # how many ranks' beats were compared; 0: none (an older record)
    stamp: str = ""  # the writing holder's lock stamp; "" without a lock, or in an older record

    def belongs_to(
        self, *, job: str | None = None, attempt: int | None = None, since: float | None = None, stamp: str = ""
    ) -> bool:
        """Whether this record is that attempt's: the same job and attempt, of the holder of the lock
        stamped `stamp` (where both are known), and not older than its start (stamps.this_attempts)."""
        if job is not None and self.job and self.job != job:
            return False
        if attempt is not None and self.attempt != attempt:
            return False
        return this_attempts(self.stamp, stamp, self.time, since)


@dataclass(frozen=True)
class Marker:
    """The PREEMPTED marker as read back."""

    why: str  # the step checkpointed, or the hang's sentence
    stamp: str = ""  # the writing holder's lock stamp; "" without a lock, or in an older marker
    landed: float = 0.0  # its mtime: the storage's clock, like the attempt's start it is compared with


def describe_hang(record: HangRecord) -> str:
    """`hang: rank 3 on n2 stopped at step 812; the others wait in all_reduce`: what status says."""
    if not record.stopped and not record.compared:
        return f"hang (rank {record.rank})"
    if not record.stopped:
        at = "" if record.step is None else f" at step {record.step}"
        fired = f"rank {record.rank}'s watchdog fired"
        return f"hang: all {record.compared} ranks stopped{at}, none before the others ({fired})"
    who = ", ".join(f"{s.rank}" + (f" on {s.host}" if s.host else "") for s in record.stopped)
    steps = sorted({s.step for s in record.stopped if s.step is not None})
    at = f" at step {steps[0]}" if len(steps) == 1 else f" at steps {', '.join(map(str, steps))}" if steps else ""
    text = f"hang: rank{'s' if len(record.stopped) > 1 else ''} {who} stopped{at}"
    if record.others:
        text += f"; the others wait in {record.others}"
    return text


def job_id(environ: Mapping[str, str] | None = None) -> str:
    """This process's job as status names it: SLURM's id, an array task as `<array>_<task>`."""
    env = os.environ if environ is None else environ
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID", "") or env.get("DIST_JOBS_SUBMISSION", "")


def write_hang(folder: Path, record: HangRecord) -> None:
    """Leave `record` unless a rank of the same attempt already left one, or the holder LOCK names
    now did (a superseded holder's late write never replaces the live holder's record)."""
    text = json.dumps(asdict(record), sort_keys=True) + "\n"
    if write_new(folder / HANG_RECORD, text):
        return
    there = read_hang(folder)
    if there is not None and there.stamp and there.stamp != record.stamp and there.stamp == holder_stamp(folder):
        return
    if there is None or not there.belongs_to(job=record.job or None, attempt=record.attempt, stamp=record.stamp):
        write_atomic(folder / HANG_RECORD, text)  # an earlier attempt's (or unreadable): this attempt's wins


def attempt_hang(folder: Path, since: float | None, stamp: str = "", job: str | None = None) -> HangRecord | None:
    """The hang record of the attempt that started at `since` holding the lock stamped `stamp`
    ("": unknown) in job `job` (None: unknown), or None when it left none (HangRecord.belongs_to)."""
    found = read_hang(folder)
    return found if found is not None and found.belongs_to(job=job, since=since, stamp=stamp) else None


def write_preempted(folder: Path, why: str, stamp: str = "") -> None:
    """Leave the PREEMPTED marker: the run checkpointed (or hung) and asks to be requeued."""
    marker = {"why": why, STAMP: stamp, "time": time.time()}
    write_atomic(folder / PREEMPTED_MARKER, json.dumps(marker, sort_keys=True) + "\n")


def read_preempted(folder: Path) -> Marker | None:
    """The PREEMPTED marker, or None when there is none; an older version's plain text is its `why`."""
    path = folder / PREEMPTED_MARKER
    try:
        landed, text = path.stat().st_mtime, path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("why"), str):
        return Marker(data["why"], stamp_in(data), landed)
    return Marker(text.strip(), "", landed)  # an older version's: the text alone


def preempted_since(folder: Path, since: float, stamp: str = "") -> bool:
    """Whether the PREEMPTED marker is the attempt's that started at `since` holding the lock
    stamped `stamp` ("": unknown): that attempt checkpointed on a signal (or hung), not an earlier
    attempt, nor a holder that lost the run directory and wrote late (stamps.this_attempts)."""
    marker = read_preempted(folder)
    return marker is not None and this_attempts(marker.stamp, stamp, marker.landed, since)


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
            host=str(data.get("host", "")),
            stopped=tuple(_stopped_rank(s) for s in data.get("stopped", ())),
            others=str(data.get("others", "")),
            compared=int(data.get("compared", 0)),
            stamp=stamp_in(data),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _stopped_rank(data: Mapping[str, object]) -> StoppedRank:
    step = data.get("step")
    return StoppedRank(
        rank=int(str(data["rank"])), host=str(data.get("host", "")), step=None if step is None else int(str(step))
    )
