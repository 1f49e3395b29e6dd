"""Parse what sbatch, squeue and sacct print (Slurm 22.05), as pure functions.

The format strings are module constants so the backend asks for exactly the columns these
parsers expect. Every parser is tested against output captured from a real cluster
(tests/fixtures/slurm/, see its INDEX.md). The job name is always the last column: it is
the only free-text field, so a `|` inside it cannot shift the columns before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Sequence

from dist_jobs.errors import BackendError

# For `squeue --noheader --format SQUEUE_FORMAT`. %-codes have no restart count; use
# SQUEUE_FORMAT_LONG with `--Format` (capital F) to get it. Both give the same columns.
SQUEUE_FORMAT = "%i|%T|%r|%D|%N|%M|%l|%V|%S|%P|%j"
# For `squeue --noheader --Format SQUEUE_FORMAT_LONG`: `:|` is "no width limit, then |".
SQUEUE_FORMAT_LONG = ("JobID:|,State:|,Reason:|,NumNodes:|,NodeList:|,TimeUsed:|,TimeLimit:|,"
                      "SubmitTime:|,StartTime:|,Partition:|,RestartCnt:|,Name:")
# For `sacct --parsable2 --noheader --format SACCT_FIELDS` (add --duplicates for every attempt
# of a requeued job). 22.05's sacct has no restart count: with --duplicates, count attempts.
SACCT_FIELDS = "JobID,JobIDRaw,State,ExitCode,Submit,Start,End,Elapsed,NNodes,NodeList,Partition,JobName"

_SQUEUE_COLUMNS = {
    "%i": "job_id", "%T": "state", "%r": "reason", "%D": "nodes", "%N": "nodelist", "%M": "time_used",
    "%l": "time_limit", "%V": "submit_time", "%S": "start_time", "%P": "partition", "%j": "name",
    "JobID": "job_id", "State": "state", "Reason": "reason", "NumNodes": "nodes", "NodeList": "nodelist",
    "TimeUsed": "time_used", "TimeLimit": "time_limit", "SubmitTime": "submit_time",
    "StartTime": "start_time", "Partition": "partition", "RestartCnt": "restarts", "Name": "name",
}
_NO_TIME = frozenset({"", "N/A", "None", "Unknown", "NONE"})
_NO_LIMIT = frozenset({"UNLIMITED", "INFINITE", "NOT_SET", "INVALID", "N/A", ""})
_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration (`1-02:03:04`, `2:03:04`, `03:04`, `0:00`); None for UNLIMITED.

    Slurm prints minutes:seconds when under an hour, so `1:00` is one minute.
    """
    text = text.strip()
    if text in _NO_LIMIT:
        return None
    m = _DURATION.match(text)
    if not m:
        raise BackendError(f"unexpected Slurm duration {text!r}", "expected [days-][hours:]minutes:seconds")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_timestamp(text: str) -> datetime | None:
    """A Slurm timestamp (`2026-11-22T05:16:22`, local time, naive); None for Unknown/N/A/None."""
    text = text.strip()
    if text in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise BackendError(f"unexpected Slurm timestamp {text!r}", "expected YYYY-MM-DDTHH:MM:SS") from None


def parse_sbatch_job_id(stdout: str) -> str:
    """The job id from `sbatch --parsable`: `123` or `123;cluster` (multi-cluster)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    job_id = lines[-1].split(";", 1)[0] if lines else ""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise BackendError(f"sbatch --parsable printed no job id (stdout: {stdout.strip()!r})",
                           "run the same sbatch by hand to see its messages")
    return job_id


@dataclass(frozen=True)
class SbatchTestOnly:
    """What `sbatch --test-only` predicts (it prints this on stderr, exit 0)."""

    job_id: str
    start: datetime | None  # None when the estimate is not a usable date (22.05 can print year 10193)
    cpus: int
    nodelist: str
    partition: str


_TEST_ONLY = re.compile(r"Job (\d+) to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)")


def parse_sbatch_test_only(stderr: str) -> SbatchTestOnly:
    match = _TEST_ONLY.search(stderr)
    if not match:
        raise BackendError(f"sbatch --test-only printed no estimate: {stderr.strip()!r}",
                           "the job cannot run as asked; see sbatch's message")
    job_id, start, cpus, nodelist, partition = match.groups()
    try:
        when: datetime | None = datetime.fromisoformat(start)
    except ValueError:
        when = None
    return SbatchTestOnly(job_id, when, int(cpus), nodelist, partition)


@dataclass(frozen=True)
class SlurmJob:
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


def _split_columns(fmt: str) -> list[str]:
    if "%" in fmt:
        return [re.sub(r"%[.\d]*", "%", col) for col in fmt.split("|")]
    return [col.split(":", 1)[0] for col in fmt.split(",")]


def parse_squeue(stdout: str, fmt: str = SQUEUE_FORMAT) -> list[SlurmJob]:
    """Jobs from `squeue --noheader` run with `fmt` (SQUEUE_FORMAT or SQUEUE_FORMAT_LONG)."""
    columns = [_SQUEUE_COLUMNS.get(col, col) for col in _split_columns(fmt)]
    jobs = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        values = line.split("|", len(columns) - 1)
        if len(values) != len(columns):
            raise BackendError(f"unexpected squeue line {line!r}: {len(values)} columns, expected {len(columns)}",
                               "pass the same format to squeue and parse_squeue")
        row = dict(zip(columns, values))
        restarts = row.get("restarts")
        jobs.append(SlurmJob(
            job_id=row["job_id"], name=row["name"], state=row["state"], reason=row["reason"],
            nodes=_int(row["nodes"]) or 0, nodelist=row["nodelist"], time_used=row["time_used"],
            time_limit=row["time_limit"], submit_time=parse_timestamp(row["submit_time"]),
            start_time=parse_timestamp(row["start_time"]), partition=row["partition"],
            restarts=_int(restarts) if restarts is not None else None))
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


def parse_sacct(stdout: str) -> list[SacctRow]:
    """Rows from `sacct --parsable2 --noheader --format SACCT_FIELDS`."""
    width = len(SACCT_FIELDS.split(","))
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        values = line.split("|", width - 1)
        if len(values) != width:
            raise BackendError(f"unexpected sacct line {line!r}: {len(values)} columns, expected {width}",
                               "run sacct with --parsable2 --noheader --format SACCT_FIELDS")
        job_id, raw, state, exit_text, submit, start, end, elapsed, nnodes, nodelist, partition, name = values
        word, _, detail = state.partition(" ")
        code, sig = _exit_code(exit_text)
        rows.append(SacctRow(job_id, raw, word, detail, code, sig, parse_timestamp(submit), parse_timestamp(start),
                             parse_timestamp(end), elapsed, _int(nnodes), nodelist, partition, name))
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
    attempts: int  # allocation lines seen; with --duplicates, 1 + number of requeues


def sacct_job_state(rows: Sequence[SacctRow], job_id: str) -> SacctJobState | None:
    """Reduce sacct rows to job `job_id`'s state; None if sacct printed nothing for it.

    Steps (`.batch`, `.0`) are ignored: the allocation line carries the job's state and exit
    code. With --duplicates each requeue left a line (REQUEUED, then the next attempt); the
    latest attempt is the one submitted last (a requeue resets Submit), ties by output order.
    """
    allocations = [(i, r) for i, r in enumerate(rows)
                   if r.is_allocation and job_id in (r.job_id, r.job_id_raw)]
    if not allocations:
        return None
    key: Callable[[tuple[int, SacctRow]], tuple[datetime, datetime, int]] = lambda ir: (
        ir[1].submit or datetime.min, ir[1].start or datetime.min, ir[0])
    row = max(allocations, key=key)[1]
    return SacctJobState(row.job_id, row.name, row.state, row.state_detail, row.exit_code, row.exit_signal,
                         row.nodelist, row.elapsed, row.start, row.end, len(allocations))


# (pattern in sbatch's stderr, what it means, what to do). First match wins; the more specific
# client-side messages come before the controller's generic "submission failed" reasons.
_SBATCH_ERRORS: tuple[tuple[str, str, str], ...] = (
    (r"Unable to contact slurm controller|Could not establish a configuration source|"
     r"Zero Bytes were transmitted or received",
     "sbatch cannot reach the SLURM controller (slurmctld)",
     "check `scontrol ping` and `sinfo`; for the local test cluster run `bash slurm/cluster/up.sh`"),
    (r"Munge encode failed|Protocol authentication error|Invalid authentication credential",
     "sbatch cannot authenticate to SLURM: munge failed (is munged running?)",
     "check `munge -n | unmunge`; for the local test cluster run `bash slurm/cluster/up.sh`"),
    (r"invalid partition specified: (?P<partition>\S+)|Invalid partition name specified",
     "SLURM has no partition {partition!r}",
     "run `sinfo -s` to list the partitions and set `slurm.partition` in the job spec to one of them"),
    (r"Node count specification invalid",
     "SLURM rejected the node count: more nodes than the partition has{nodes_note}",
     "run `sinfo -N` to see the nodes; lower `nodes` in the job spec"),
    (r"More processors requested than permitted",
     "SLURM rejected the job: more CPUs/tasks requested than the nodes have{nodes_note}",
     "run `sinfo -N -o '%N %c'` to see CPUs per node; lower `procs_per_node` or `cpus_per_task`"),
    (r"(?P<detail>Memory specification can not be satisfied|CPU count per node can not be satisfied)",
     "SLURM rejected the job: {detail}",
     "run `sinfo -N -o '%N %c %m'` to see each node's CPUs and memory (MB); "
     "ask for less (`memory`, `cpus_per_task`)"),
    (r"Invalid generic resource \(gres\) specification",
     "SLURM rejected the GPU request: this cluster (or partition) has no such generic resource (gres)",
     "run `sinfo -o '%P %G'` to see each partition's GPUs; set `gpus_per_node` to what is there (0 without "
     "GPUs, with `procs_per_node`), or `slurm.gpus_flag: gres` where the site wants --gres=gpu:N"),
    (r"Requested node configuration is not available",
     "SLURM has no nodes matching the request (node count, CPUs, memory, GPUs or features){nodes_note}",
     "run `sinfo -N -o '%N %c %m %G %f'` to see what the nodes offer, then ask for at most that "
     "(`nodes`, `procs_per_node`, `memory`, `gpus_per_node`)"),
    (r"Invalid --time specification|Requested time limit is invalid",
     "SLURM rejected the time limit",
     "write `time` as minutes, MM:SS, HH:MM:SS or D-HH:MM:SS (e.g. 1-00:00:00); "
     "`sinfo -o '%P %l'` shows each partition's limit"),
    (r"Invalid account",
     "SLURM rejected the account (or this account may not use the partition)",
     "run `sacctmgr show assoc user=$USER format=account,partition` and set `slurm.account` to one listed"),
    (r"Invalid qos",
     "SLURM rejected the QOS",
     "run `sacctmgr show assoc user=$USER format=account,qos` and set `slurm.qos` to one listed"),
    (r"Job violates accounting/QOS policy",
     "SLURM rejected the job: it breaks an accounting/QOS limit (job count, size or time)",
     "run `sacctmgr show qos` to see the limits; ask for less or wait for jobs to finish"),
    (r"Unable to open file|This does not look like a batch script|Batch script is empty",
     "sbatch could not read a batch script",
     "check that the script exists, is readable and starts with #!/bin/bash"),
)


def sbatch_error(stderr: str, returncode: int, *, cluster_nodes: int | None = None) -> BackendError:
    """A BackendError explaining a failed sbatch; `cluster_nodes` adds "this cluster has N nodes"."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    nodes_note = f" (this cluster has {cluster_nodes} nodes)" if cluster_nodes else ""
    for pattern, message, hint in _SBATCH_ERRORS:
        match = re.search(pattern, stderr, flags=re.IGNORECASE)
        if match:
            values = {"partition": "?", "detail": "", **{k: v for k, v in match.groupdict().items() if v}}
            text = message.format(nodes_note=nodes_note, **values)
            return BackendError(f"{text}. sbatch said: {_said(lines)}", hint)
    return BackendError(f"sbatch failed with exit code {returncode}: {_said(lines) or '(no message)'}",
                        "run the same sbatch command by hand to see its full output")


def _said(lines: list[str]) -> str:
    """sbatch's own words, without the repeated `sbatch: error:` prefixes."""
    return " / ".join(re.sub(r"^sbatch: (error: )?", "", line) for line in lines)
