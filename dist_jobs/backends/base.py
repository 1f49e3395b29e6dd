"""The one backend interface.

`prepare()` is pure and IS the dry run: it returns the exact bytes `submit()` hands to the
scheduler (torchx's `submit = schedule(dryrun(...))`). The I/O verbs go through an object given
to the backend's constructor (a command runner, an API client), so tests inject fakes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dist_jobs.backends.handle import Handle
from dist_jobs.backends.state import JobState, normalise
from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.ledger import Ledger
from dist_jobs.rundir.place import RunDir
from dist_jobs.spec.paths import checkpoint_root

if TYPE_CHECKING:
    from dist_jobs.spec import JobSpec  # status, list, cancel and logs need no spec classes (msgspec)


def run_dir_of(spec: JobSpec, workdir: Path) -> RunDir:
    """The one builder of a job's run directory: the spec's checkpoint_dir as the job reads it
    (`~` expanded on this host, a relative one below `workdir`, where the job runs), joined with
    its run id. Each backend passes its view: the job's folder here, the volume's mount in a pod."""
    return RunDir.at(checkpoint_root(spec.checkpoint_dir, workdir), spec.run_id)


@dataclass(frozen=True)
class Prepared:
    backend: str
    spec: JobSpec
    payload: str  # the exact script or manifest submitted
    filename: str  # what to call it in a job directory
    # where the run lives as the submitting host sees it (run_dir_of); None in a sweep's trial
    # made from its dry run, whose backend builds it at submit
    run_dir: RunDir | None = None


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    name: str
    state: str  # the scheduler's own word: PENDING, RUNNING, Succeeded, ...
    detail: str = ""
    extra: dict[str, str] = field(default_factory=dict, hash=False)
    ranks: dict[int, str] = field(default_factory=dict, hash=False)  # per-rank detail where the backend knows it
    # The JobState value where the word alone cannot say it (SLURM's COMPLETING of a requeued
    # job is "requeued"); "" lets the word decide (backends.state.normalise).
    normal: str = ""
    handle: str = ""  # the job's handle where the backend lists it (list()): slurm://c/12, k8s://ns/KIND/name
    # where its wall time went, across attempts (dist_jobs.rundir.ledger), where the run directory is readable
    goodput: Ledger | None = field(default=None, hash=False, compare=False)

    @property
    def job_state(self) -> JobState:
        """The word in the one vocabulary (dist_jobs.backends.state)."""
        return JobState(self.normal) if self.normal else normalise(self.state)

    @property
    def finished(self) -> bool:
        return self.job_state.finished


class Backend(Protocol):
    """What every backend provides. A job is named by its handle (`handle()`, what `submit()`
    returns); the other verbs take the job's id within the backend (Handle.job_id)."""

    name: str

    def prepare(self, spec: JobSpec) -> Prepared: ...

    def submit(self, prepared: Prepared) -> Handle: ...

    def handle(self, job_id: str) -> Handle: ...

    def status(self, job_id: str) -> JobStatus: ...

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | DistJobsError]:
        """Each job's status, asking the scheduler as few times as it can (SLURM: once); a job
        it cannot read gets its error. An error for all of them (no scheduler) is raised."""
        ...

    def list(self) -> list[JobStatus]: ...

    def cancel(self, job_id: str) -> None: ...

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]: ...

    def run_dir(self, job_id: str) -> Path:
        """`<checkpoint_dir>/<run>` as this host sees it; BackendError where it cannot say."""
        ...

    def owner(self, job_id: str) -> str | None:
        """The job as its trainer names itself in progress.json (None: whoever wrote it)."""
        ...


def each_status(backend: Backend, job_ids: list[str]) -> dict[str, JobStatus | DistJobsError]:
    """`statuses()` of a backend without a batch query: each job asked on its own."""
    found: dict[str, JobStatus | DistJobsError] = {}
    for job_id in job_ids:
        try:
            found[job_id] = backend.status(job_id)
        except DistJobsError as exc:  # one job it cannot read (a trial not started yet)
            found[job_id] = exc
    return found
