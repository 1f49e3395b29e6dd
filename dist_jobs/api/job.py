"""`Job`: one handle on a submitted job, the same on every backend.

job = dist_jobs.submit(spec, backend="slurm")     # or dist_jobs.attach("slurm://c/123")
print(job)                                        # slurm://c/123
info = job.wait(timeout=3600)                     # JobInfo: state, the scheduler's word, ranks
for line in job.logs(rank=0): print(line)
metrics = job.result()                            # waits; rank 0's final metrics, or JobFailed
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dist_jobs.api.plot import plot_run
from dist_jobs.api.polling import poll_until
from dist_jobs.backends import Backend, JobStatus
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.jobstate import JobState
from dist_jobs.constants import WAIT_EXIT_CODES
from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.checkpoints import newest_committed
from dist_jobs.rundir.ledger import Ledger
from dist_jobs.rundir.progress import owned_by, quiet_for, read_progress
from dist_jobs.rundir.result import read_result


class WaitTimeout(DistJobsError):
    """wait(timeout) ran out with the job still pending or running."""

    exit_code = WAIT_EXIT_CODES["timeout"]


@dataclass(frozen=True)
class JobInfo:
    handle: str
    name: str
    state: JobState  # normalised: pending, running, succeeded, failed, cancelled, requeued, unknown
    word: str  # the scheduler's own word: PENDING, COMPLETED, Succeeded, ...
    detail: str = ""
    ranks: dict[int, str] = field(default_factory=dict, hash=False)  # per-rank detail where known
    extra: dict[str, str] = field(default_factory=dict, hash=False)
    # rank 0's <run dir>/progress.json (dist_jobs.rundir.progress) when it is readable from here
    progress: dict[str, Any] | None = field(default=None, hash=False)
    # where the run's wall time went, across attempts (dist_jobs.rundir.ledger); None where unknown
    goodput: Ledger | None = field(default=None, hash=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state.finished

    def to_dict(self) -> dict[str, Any]:
        """Plain data; the ledger as `goodput` (the run's totals) and `attempts` (each one's share)."""
        ledger, plain = self.goodput, dataclasses.replace(self, goodput=None)
        out = {**dataclasses.asdict(plain), "extra": dict(self.extra)}
        out["state"] = self.state.value
        out["ranks"] = {str(k): v for k, v in self.ranks.items()}
        out["goodput"] = None if ledger is None else ledger.summary()
        out["attempts"] = [] if ledger is None else ledger.attempt_dicts()
        return out


class JobFailed(DistJobsError):
    """The job ended without succeeding (failed or cancelled): `state`, the rank that failed
    first and its exit code or signal where the scheduler said so, and its whole `detail`.
    `exit_code` is what `dist-jobs wait` exits with (1 failed, 3 cancelled)."""

    def __init__(self, info: JobInfo) -> None:
        self.info, self.state, self.detail = info, info.state, info.detail
        self.rank, self.code, self.signal = _failure(info)
        self.exit_code = WAIT_EXIT_CODES.get(info.state.value, WAIT_EXIT_CODES["failed"])
        said = f": {info.detail}" if info.detail else ""
        super().__init__(
            f"{info.handle} {info.state}{said}",
            f"its logs say why: dist-jobs logs {info.handle}" + ("" if self.rank is None else f" --rank {self.rank}"),
        )


def _failure(info: JobInfo) -> tuple[int | None, int | None, str | None]:
    """(first failing rank, its exit code, its signal) from a status detail such as
    `rank 1 failed first: exit 3 on n1` or `killed by SIGKILL (exit 137)`."""
    first = re.search(r"\brank (\d+) failed first: ([^;]*)", info.detail)
    rank = int(first.group(1)) if first else None
    if rank is None and len(info.ranks) == 1:
        rank = next(iter(info.ranks))
    told = first.group(2) if first else (info.ranks.get(rank, "") if rank is not None else "") or info.detail
    code = re.search(r"\bexit (\d+)", told)
    signal = re.search(r"killed by (SIG[A-Z0-9]+)", told)
    return rank, int(code.group(1)) if code else None, signal.group(1) if signal else None


def info_of(handle: str, status: JobStatus) -> JobInfo:
    return JobInfo(
        handle,
        status.name,
        status.job_state,
        status.state,
        status.detail,
        dict(status.ranks),
        status.extra,
        goodput=status.goodput,
    )


class Job:
    def __init__(self, handle: Handle, backend: Backend) -> None:
        self._handle = handle
        self._backend = backend

    @property
    def handle(self) -> str:
        return str(self._handle)

    @property
    def id(self) -> str:
        """The scheduler's id: SLURM job id, Kubernetes object name, local run directory."""
        return self._handle.job_id

    def __str__(self) -> str:
        return self.handle

    def __repr__(self) -> str:
        return f"Job({str(self._handle)!r})"  # runs nothing: the handle is known

    def __eq__(self, other: object) -> bool:
        """The same job: the same handle (backend, id and where it lives)."""
        if not isinstance(other, Job):
            return NotImplemented
        return self._handle == other._handle

    def __hash__(self) -> int:
        return hash(self._handle)

    def status(self) -> JobInfo:
        """The scheduler's state, with the run's live progress where its run directory is readable."""
        return self.info_from(self._backend.status(self.id))

    def info_from(self, status: JobStatus) -> JobInfo:
        """JobInfo of the scheduler's `status` of this job, with its progress (see status())."""
        info = info_of(self.handle, status)
        progress = self.progress()
        if progress is not None and info.state is not JobState.RUNNING:
            progress["eta_s"] = None  # no rank runs: an ETA from the last log interval would be a guess
        elif progress is not None and (quiet := quiet_for(progress, time.time())) is not None:
            progress.update(eta_s=None, quiet_s=quiet)  # running to the scheduler, but no rank steps
        return dataclasses.replace(info, progress=progress)

    @property
    def state(self) -> JobState:
        """The normalised state now (one scheduler query)."""
        return self._backend.status(self.id).job_state

    def done(self) -> bool:
        """Whether the job has ended: succeeded, failed or cancelled (one scheduler query)."""
        return self.state.finished

    def progress(self) -> dict[str, Any] | None:
        """Rank 0's `<run dir>/progress.json`: step of total, epoch, metrics, samples/s, ETA, last
        checkpoint, attempt, state. None before the first log interval, when the run directory
        is not readable from here (a Kubernetes volume this host does not mount), or when another
        job sharing the run directory wrote it. `checkpoint_step` is the newest committed one."""
        try:
            run_dir = self._backend.run_dir(self.id)
            progress = read_progress(run_dir)
            if progress is None or not owned_by(progress, self._backend.owner(self.id)):
                return None
        except DistJobsError:
            return None
        # progress.json is written at log intervals: a checkpoint committed since is newer.
        newest, said = newest_committed(run_dir), progress.get("checkpoint_step")
        if newest is not None and not (isinstance(said, int) and said >= newest):
            progress["checkpoint_step"] = newest
        return progress

    def wait(self, timeout: float | None = None, poll: float | None = None, raise_on_failure: bool = False) -> JobInfo:
        """Until the job succeeds, fails or is cancelled: its final JobInfo. WaitTimeout after
        `timeout` seconds; JobFailed when it did not succeed and `raise_on_failure`. The pause
        between polls starts at `poll` seconds (default 2) and backs off (dist_jobs.api.polling)."""
        return wait_all([self], timeout, poll, raise_on_failure)[0]

    def logs(self, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Rank `rank`'s lines (local: every rank's when None); follow=True until the job ends."""
        return self._backend.logs(self.id, rank=rank, follow=follow)

    def log_ranks(self, spec: Any) -> list[int] | None:
        """The ranks whose logs together hold every line of `spec`'s job (None: one log has all)."""
        return self._backend.log_ranks(spec)

    def follow(self, ranks: Sequence[int] | None = None) -> Iterator[str]:
        """Every rank's lines as they are written, `[rank N] ...`, until the job ends.

        `ranks`: the ranks to read (None: the backend's combined log, the local backend's)."""
        if ranks is None:
            yield from self.logs(None, follow=True)
            return
        import queue  # follow(ranks) alone: render and the query verbs import this module (their budgets)

        lines: queue.Queue[str | None] = queue.Queue()

        def pump(rank: int) -> None:
            try:
                for line in self.logs(rank, follow=True):
                    lines.put(f"[rank {rank}] {line}")
            except DistJobsError as exc:
                lines.put(f"[rank {rank}] ({exc.message})")
            finally:
                lines.put(None)

        for rank in ranks:
            threading.Thread(target=pump, args=(rank,), daemon=True).start()
        ended = 0
        while ended < len(ranks):
            item = lines.get()
            if item is None:
                ended += 1
            else:
                yield item

    def cancel(self) -> None:
        self._backend.cancel(self.id)

    @property
    def run_dir(self) -> Path:
        """The run directory, `<checkpoint_dir>/<run>`, as this host sees it (its checkpoints,
        progress and ledger): BackendError where the backend cannot say."""
        return self._backend.run_dir(self.id)

    def result(self, timeout: float | None = None) -> dict[str, float]:
        """Rank 0's final metrics, from `<run dir>/result.json` (written when fit() ends), once
        the job has ended: waits for it (WaitTimeout after `timeout` seconds), and raises
        JobFailed if it failed or was cancelled, so no earlier run's result passes for its own."""
        self.wait(timeout, raise_on_failure=True)
        return read_result(self.run_dir)

    def plot(self, path: str | Path) -> Path:
        """Draw the run into `path` (a PNG): loss, throughput and accuracy per step, each attempt
        in its colour, where it resumed and which faults ended attempts (needs dist-jobs[plot])."""
        return plot_run(self.run_dir, Path(path), self.handle).path


def wait_all(
    jobs: Sequence[Job], timeout: float | None = None, poll: float | None = None, raise_on_failure: bool = False
) -> list[JobInfo]:
    """Until every job has ended: their final JobInfos, in order. Each poll asks each scheduler
    once for all of them (dist_jobs.api.polling). JobFailed (the first such job) when one did
    not succeed and `raise_on_failure`; WaitTimeout after `timeout` seconds."""

    def check() -> tuple[bool, list[JobInfo]]:
        found = statuses(jobs)
        failed = next((f for f in found if isinstance(f, DistJobsError)), None)
        if failed is not None:
            raise failed
        infos = [f for f in found if not isinstance(f, DistJobsError)]
        return all(i.finished for i in infos), infos

    def expired(infos: list[JobInfo]) -> DistJobsError:
        left = [i for i in infos if not i.finished]
        if len(jobs) == 1:
            return WaitTimeout(
                f"{left[0].handle} is still {left[0].state} after {timeout:g} s",
                f"wait longer, or look at it: dist-jobs status {left[0].handle}",
            )
        return WaitTimeout(
            f"{len(left)} of {len(infos)} jobs still not ended after {timeout:g} s (first: {left[0].handle})",
            f"wait longer, or look at them: dist-jobs status {left[0].handle}",
        )

    infos = poll_until(check, timeout, expired, poll)
    bad = next((i for i in infos if i.state is not JobState.SUCCEEDED), None)
    if raise_on_failure and bad is not None:
        raise JobFailed(bad)
    return infos


def statuses(jobs: Sequence[Job]) -> list[JobInfo | DistJobsError]:
    """Each job's JobInfo (or the error asking for it raised), one scheduler query per backend
    object (a SLURM backend answers for many jobs with one squeue and one sacct)."""
    out: list[JobInfo | DistJobsError | None] = [None] * len(jobs)
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(id(job._backend), []).append(i)
    for members in groups.values():
        backend = jobs[members[0]]._backend
        if len(members) == 1:
            out[members[0]] = _one(jobs[members[0]])
            continue
        try:
            found = backend.statuses([jobs[i].id for i in members])
        except DistJobsError as exc:  # the scheduler did not answer: for every one of them
            for i in members:
                out[i] = exc
            continue
        for i in members:
            got = found[jobs[i].id]
            out[i] = got if isinstance(got, DistJobsError) else jobs[i].info_from(got)
    return [o for o in out if o is not None]


def _one(job: Job) -> JobInfo | DistJobsError:
    try:
        return job.status()
    except DistJobsError as exc:
        return exc
