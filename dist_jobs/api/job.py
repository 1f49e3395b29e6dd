"""`Job`: one handle on a submitted job, the same on every backend.

job = dist_jobs.submit(spec, backend="slurm")     # or dist_jobs.attach("slurm://c/123")
print(job)                                        # slurm://c/123
info = job.wait(timeout=3600)                     # JobInfo: state, the scheduler's word, ranks
for line in job.logs(rank=0): print(line)
metrics = job.result()                            # rank 0's final metrics (result.json)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dist_jobs.api.handle import Handle
from dist_jobs.backends.state import JobState
from dist_jobs.constants import WAIT_EXIT_CODES
from dist_jobs.errors import BackendError, DistJobsError

if TYPE_CHECKING:
    from dist_jobs.backends import Backend, JobStatus


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

    @property
    def finished(self) -> bool:
        return self.state.finished

    def to_dict(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "extra": dict(self.extra)}
        out["state"] = self.state.value
        out["ranks"] = {str(k): v for k, v in self.ranks.items()}
        return out


def info_of(handle: str, status: JobStatus) -> JobInfo:
    return JobInfo(handle, status.name, status.job_state, status.state, status.detail, dict(status.ranks), status.extra)


class Job:
    def __init__(self, handle: Handle, backend: Backend) -> None:
        self._handle = handle
        self._backend = backend

    @property
    def handle(self) -> str:
        if self._handle.backend == "slurm" and not self._handle.cluster:
            self._handle = dataclasses.replace(self._handle, cluster=self._backend.cluster_name())  # type: ignore[attr-defined]
        return str(self._handle)

    @property
    def id(self) -> str:
        """The scheduler's id: SLURM job id, Kubernetes object name, local run directory."""
        return self._handle.job_id

    def __str__(self) -> str:
        return self.handle

    def __repr__(self) -> str:
        return f"Job({self.handle!r})"

    def status(self) -> JobInfo:
        """The scheduler's state, with the run's live progress where its run directory is readable."""
        info = info_of(self.handle, self._backend.status(self.id))
        progress = self.progress()
        if progress is not None and info.state is not JobState.RUNNING:
            progress["eta_s"] = None  # no rank runs: an ETA from the last log interval would be a guess
        return dataclasses.replace(info, progress=progress)

    def progress(self) -> dict[str, Any] | None:
        """Rank 0's `<run dir>/progress.json`: step of total, epoch, metrics, samples/s, ETA, last
        checkpoint, attempt, state. None before the first log interval, when the run directory
        is not readable from here (a Kubernetes volume this host does not mount), or when another
        job sharing the run directory wrote it. `checkpoint_step` is the newest committed one."""
        from dist_jobs.rundir.checkpoints import newest_committed
        from dist_jobs.rundir.progress import owned_by, read_progress

        find = getattr(self._backend, "run_dir", None)
        owner = getattr(self._backend, "owner", None)
        if find is None:
            return None
        try:
            run_dir = find(self.id)
            progress = read_progress(run_dir)
            if progress is None or not owned_by(progress, owner(self.id) if owner else None):
                return None
        except DistJobsError:
            return None
        # progress.json is written at log intervals: a checkpoint committed since is newer.
        newest, said = newest_committed(run_dir), progress.get("checkpoint_step")
        if newest is not None and not (isinstance(said, int) and said >= newest):
            progress["checkpoint_step"] = newest
        return progress

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> JobInfo:
        """Until the job succeeds, fails or is cancelled; WaitTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.status()
            if info.finished:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"{self.handle} is still {info.state} after {timeout:g} s",
                    f"wait longer, or look at it: dist-jobs status {self.handle}",
                )
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))

    def logs(self, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Rank `rank`'s lines (local: every rank's when None); follow=True until the job ends."""
        return self._backend.logs(self.id, rank=rank, follow=follow)

    def follow(self, ranks: Sequence[int] | None = None) -> Iterator[str]:
        """Every rank's lines as they are written, `[rank N] ...`, until the job ends.

        `ranks`: the ranks to read (None: the backend's combined log, the local backend's)."""
        if ranks is None:
            yield from self.logs(None, follow=True)
            return
        import queue
        import threading

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

    def result(self) -> dict[str, float]:
        """Rank 0's final metrics, from `<run dir>/result.json` (written when fit() ends)."""
        from dist_jobs.rundir.result import read_result

        find = getattr(self._backend, "run_dir", None)
        if find is None:
            raise BackendError(
                f"{self.handle}: its run directory is on the job's volume, not readable from here",
                "read <checkpoint_dir>/<run>/result.json from a pod that mounts the PVC",
            )
        return read_result(find(self.id))
