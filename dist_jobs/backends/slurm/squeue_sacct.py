"""Parse what squeue and sacct print (Slurm 22.05), as pure functions (sbatch: sbatch.py).

The format strings are module constants so the backend asks for exactly the columns these
parsers expect. Every parser is tested against output captured from a real cluster
(tests/fixtures/slurm/, see its INDEX.md). The job name is always the last column: it is
the only free-text field, so a `|` inside it cannot shift the columns before it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.errors import BackendError
from dist_jobs.spec.slurm_time import NO_LIMIT, parse_time

# For `squeue --noheader --format SQUEUE_FORMAT`. %-codes have no restart count; use
# SQUEUE_FORMAT_LONG with `--Format` (capital F) to get it. Both give the same columns.
SQUEUE_FORMAT = "%i|%T|%r|%D|%N|%M|%l|%V|%S|%P|%j"
# For `squeue --noheader --Format SQUEUE_FORMAT_LONG`: `:|` is "no width limit, then |".
SQUEUE_FORMAT_LONG = (
    "JobID:|,State:|,Reason:|,NumNodes:|,NodeList:|,TimeUsed:|,TimeLimit:|,"
    "SubmitTime:|,StartTime:|,Partition:|,RestartCnt:|,Name:"
)
# For `sacct --parsable2 --noheader --format SACCT_FIELDS` (add --duplicates for every attempt
# of a requeued job). 22.05's sacct has no restart count: with --duplicates, count attempts.
SACCT_FIELDS = "JobID,JobIDRaw,State,ExitCode,Submit,Start,End,Elapsed,NNodes,NodeList,Partition,JobName"

_SQUEUE_COLUMNS = {
    "%i": "job_id",
    "%T": "state",
    "%r": "reason",
    "%D": "nodes",
    "%N": "nodelist",
    "%M": "time_used",
    "%l": "time_limit",
    "%V": "submit_time",
    "%S": "start_time",
    "%P": "partition",
    "%j": "name",
    "JobID": "job_id",
    "State": "state",
    "Reason": "reason",
    "NumNodes": "nodes",
    "NodeList": "nodelist",
    "TimeUsed": "time_used",
    "TimeLimit": "time_limit",
    "SubmitTime": "submit_time",
    "StartTime": "start_time",
    "Partition": "partition",
    "RestartCnt": "restarts",
    "Name": "name",
}
_NO_TIME = frozenset({"", "N/A", "None", "Unknown", "NONE"})


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration (`1-02:03:04`, `2:03:04`, `03:04`, `0:00`); None for UNLIMITED."""
    text = text.strip()
    if text in NO_LIMIT:
        return None
    seconds = parse_time(text.split(".")[0]) if ":" in text else None  # sacct prints at least MM:SS
    if seconds is None:
        raise BackendError(f"unexpected Slurm duration {text!r}", "expected [days-][hours:]minutes:seconds")
    return seconds


def parse_timestamp(text: str) -> datetime | None:
    """A Slurm timestamp (`2026-11-22T05:16:22`, local time, naive); None for Unknown/N/A/None."""
    text = text.strip()
    if text in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise BackendError(f"unexpected Slurm timestamp {text!r}", "expected YYYY-MM-DDTHH:MM:SS") from None


@dataclass(frozen=True)
class QueuedJob:
    """One squeue line: a pending or running (or completing) job."""

    job_id: str
    name: str
    state: str
    reason: str  # "None" while running; why it waits while pending (Resources, BeginTime, ...)
    nodes: int
    nodelist: str  # "" while pending
    time_used: str
    time_limit: str  # "UNLIMITED" or a duration
    submit_time: datetime | None
    start_time: datetime | None  # expected start while pending, if the scheduler estimated one
    partition: str
    restarts: int | None  # only with SQUEUE_FORMAT_LONG

    @property
    def time_used_s(self) -> int | None:
        return parse_duration(self.time_used)

    @property
    def time_limit_s(self) -> int | None:
        return parse_duration(self.time_limit)


_CLUSTER_NAME = re.compile(r"^[ \t]*ClusterName[ \t]*=[ \t]*\"?([^\s\"#]+)", re.M | re.I)


def cluster_name_in(text: str) -> str | None:
    """ClusterName in `scontrol show config` or slurm.conf, lower case as slurmctld keeps it."""
    found = _CLUSTER_NAME.search(text)
    return found.group(1).lower() if found else None


def conf_cluster_name() -> str | None:
    """ClusterName from this host's slurm.conf ($SLURM_CONF or /etc/slurm/slurm.conf); None when
    there is no such file or it is not set there (configless, or in an Include)."""
    try:
        with open(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf", encoding="utf-8") as conf:
            return cluster_name_in(conf.read())
    except (OSError, UnicodeDecodeError):
        return None


def _split_columns(fmt: str) -> list[str]:
    if "%" in fmt:
        return [re.sub(r"%[.\d]*", "%", col) for col in fmt.split("|")]
    return [col.split(":", 1)[0] for col in fmt.split(",")]


def parse_squeue(stdout: str, fmt: str = SQUEUE_FORMAT) -> list[QueuedJob]:
    """Jobs from `squeue --noheader` run with `fmt` (SQUEUE_FORMAT or SQUEUE_FORMAT_LONG)."""
    columns = [_SQUEUE_COLUMNS.get(col, col) for col in _split_columns(fmt)]
    jobs = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        values = line.split("|", len(columns) - 1)
        if len(values) != len(columns):
            raise BackendError(
                f"unexpected squeue line {line!r}: {len(values)} columns, expected {len(columns)}",
                "pass the same format to squeue and parse_squeue",
            )
        row = dict(zip(columns, values))
        restarts = row.get("restarts")
        jobs.append(
            QueuedJob(
                job_id=row["job_id"],
                name=row["name"],
                state=row["state"],
                reason=row["reason"],
                nodes=_int(row["nodes"]) or 0,
                nodelist=row["nodelist"],
                time_used=row["time_used"],
                time_limit=row["time_limit"],
                submit_time=parse_timestamp(row["submit_time"]),
                start_time=parse_timestamp(row["start_time"]),
                partition=row["partition"],
                restarts=_int(restarts) if restarts is not None else None,
            )
        )
    return jobs


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class SacctRow:
    """One sacct line: a job allocation (`8`), or one of its steps (`8.batch`, `8.0`)."""

    job_id: str
    job_id_raw: str
    state: str  # first word: CANCELLED for "CANCELLED by 0"
    state_detail: str  # the rest: "by 0"
    exit_code: int | None
    exit_signal: int | None
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    elapsed: str
    nnodes: int | None
    nodelist: str  # "None assigned" while pending
    partition: str
    name: str

    @property
    def is_allocation(self) -> bool:
        return "." not in self.job_id

    @property
    def step(self) -> str | None:
        return self.job_id.split(".", 1)[1] if "." in self.job_id else None

    @property
    def elapsed_s(self) -> int | None:
        return parse_duration(self.elapsed)


def _exit_code(text: str) -> tuple[int | None, int | None]:
    code, _, sig = text.partition(":")
    return _int(code), _int(sig)


def sacct_exit(code: int | None, sig: int | None) -> str:
    """sacct's ExitCode `code:signal` in words. 22.05 prints the code modulo 128: a batch script's
    `exit 200` (REQUEUE_EXIT_CODE) and `exit 72` both read 72:0, 143 reads 15:0 (the real code is
    in the batch log, batchlog.py). 72 is told as both: 200 is the one dist-jobs means."""
    if not sig and code is not None and code + 128 == REQUEUE_EXIT_CODE:
        return f"{describe_exit(REQUEUE_EXIT_CODE)}, or exit {code}: sacct shows both as {code}"
    return describe_exit(code, sig)


def parse_sacct(stdout: str) -> list[SacctRow]:
    """Rows from `sacct --parsable2 --noheader --format SACCT_FIELDS`."""
    width = len(SACCT_FIELDS.split(","))
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        values = line.split("|", width - 1)
        if len(values) != width:
            raise BackendError(
                f"unexpected sacct line {line!r}: {len(values)} columns, expected {width}",
                "run sacct with --parsable2 --noheader --format SACCT_FIELDS",
            )
        job_id, raw, state, exit_text, submit, start, end, elapsed, nnodes, nodelist, partition, name = values
        word, _, detail = state.partition(" ")
        code, sig = _exit_code(exit_text)
        rows.append(
            SacctRow(
                job_id,
                raw,
                word,
                detail,
                code,
                sig,
                parse_timestamp(submit),
                parse_timestamp(start),
                parse_timestamp(end),
                elapsed,
                _int(nnodes),
                nodelist,
                partition,
                name,
            )
        )
    return rows


@dataclass(frozen=True)
class SacctJobState:
    """A job's overall state from sacct: its latest attempt's allocation line."""

    job_id: str
    name: str
    state: str
    state_detail: str
    exit_code: int | None
    exit_signal: int | None
    nodelist: str
    elapsed: str
    start: datetime | None
    end: datetime | None
    attempts: int  # allocation lines seen; with --duplicates, 1 + number of requeues (or fewer)
    job_id_raw: str = ""  # an array task's own id (SLURM_JOB_ID in it)


def sacct_job_state(rows: Sequence[SacctRow], job_id: str) -> SacctJobState | None:
    """Reduce sacct rows to job `job_id`'s state; None if sacct printed nothing for it.

    Steps (`.batch`, `.0`) are ignored: the allocation line carries the job's state and exit
    code. With --duplicates each requeue left a line (REQUEUED, then the next attempt); the
    latest attempt is the one submitted last (a requeue resets Submit), ties by output order.
    """
    allocations = [(i, r) for i, r in enumerate(rows) if r.is_allocation and job_id in (r.job_id, r.job_id_raw)]
    if not allocations:
        return None
    key: Callable[[tuple[int, SacctRow]], tuple[datetime, datetime, int]] = lambda ir: (
        ir[1].submit or datetime.min,
        ir[1].start or datetime.min,
        ir[0],
    )
    row = max(allocations, key=key)[1]
    return SacctJobState(
        row.job_id,
        row.name,
        row.state,
        row.state_detail,
        row.exit_code,
        row.exit_signal,
        row.nodelist,
        row.elapsed,
        row.start,
        row.end,
        len(allocations),
        row.job_id_raw,
    )
