"""The one backend interface: `Backend`, an abstract base class in the manner of torchx's Scheduler.

`prepare()` is pure and IS the dry run: it returns the exact bytes `submit()` hands to the
scheduler (`submit = schedule(prepare(spec))`, with the checks every backend's submit makes in
between). The I/O verbs go through an object given to the backend's constructor (a command
runner, an API client), so tests inject fakes. A backend also declares what the CLI and the API need
to know of it (its options, the flags of its spec section, its handles' fields, how its sweeps
run, the environment its jobs start with), so neither names a backend.
"""

from __future__ import annotations

import abc
import builtins
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dist_jobs.backends import records
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.jobstate import JobState, normalise
from dist_jobs.errors import BackendError, DistJobsError, Problem, UsageError
from dist_jobs.rundir.ledger import Ledger
from dist_jobs.rundir.place import RunDir
from dist_jobs.spec.paths import checkpoint_root, expand_home

if TYPE_CHECKING:
    from dist_jobs.spec import JobSpec  # status, list, cancel and logs need no spec classes (msgspec)
    from dist_jobs.spec.flags import SpecFlag


def run_dir_of(spec: JobSpec, workdir: Path) -> RunDir:
    """The one builder of a job's run directory: the spec's checkpoint_dir as the job reads it
    (`~` expanded on this host, a relative one below `workdir`, where the job runs), joined with
    its run id. Each backend passes its view: the job's folder here, the volume's mount in a pod."""
    return RunDir.at(checkpoint_root(spec.checkpoint_dir, workdir), spec.run_id)


def made(run_dir: RunDir, spec: JobSpec) -> RunDir:
    """`run_dir` with its checkpoint root created where a job starts here: bad input (the spec's
    checkpoint_dir named) when it cannot be."""
    try:
        run_dir.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"checkpoint_dir {spec.checkpoint_dir!r}: cannot create it: {exc.strerror}",
            "point checkpoint_dir (--checkpoint-dir) at a folder you may write, not at a file",
        ) from None
    return run_dir


@dataclass(frozen=True)
class SnapshotPlan:
    """Where a job's code is copied at submit: the files of `source` (resolved), less those in
    `exclude`, into `dest`. Planned by `prepare()`, which writes nothing (the dry run shows it);
    made by `take()` at submit (dist_jobs.backends.snapshot), into exactly `dest`."""

    source: Path
    dest: Path
    exclude: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Prepared:
    backend: str
    spec: JobSpec
    payload: str  # the exact script or manifest submitted
    filename: str  # what to call it in a job directory
    # where the run lives as the submitting host sees it (run_dir_of); None in a sweep's trial
    # made from its dry run, whose backend builds it at submit
    run_dir: RunDir | None = None
    # the copy of the code `spec` runs from (its workdir), which schedule() makes (snapshot.take);
    # None: it runs the code where it is, or from a copy made already (a sweep's)
    snapshot: SnapshotPlan | None = None


@dataclass(frozen=True)
class PreparedSweep:
    """The dry run: every trial's spec and the exact bytes that would be submitted."""

    name: str
    backend: str
    params: list[dict[str, Any]]
    specs: list[JobSpec]
    payloads: list[tuple[str, str]]  # (file name, exact script or manifest)
    head: JobSpec | None  # SLURM: the array's own spec
    max_parallel: int | None
    text: str  # what `--dry-run` prints

    def trials(self) -> list[Prepared]:
        """Each trial as schedule() takes it, for backends that submit a job per trial: the bytes
        the dry run showed, not a second rendering of each trial."""
        pairs = zip(self.specs, self.payloads, strict=True)
        return [Prepared(self.backend, spec, payload, filename) for spec, (filename, payload) in pairs]


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
        """The word in the one vocabulary (dist_jobs.backends.jobstate)."""
        return JobState(self.normal) if self.normal else normalise(self.state)

    @property
    def finished(self) -> bool:
        return self.job_state.finished


@dataclass(frozen=True)
class Option:
    """One constructor option of a backend as the command line gives it: `flag VALUE` becomes
    the keyword `name` (converted by `kind`)."""

    flag: str  # --jobs-dir
    name: str  # the constructor's keyword: jobs_dir
    help: str
    choices: tuple[str, ...] = ()
    kind: Callable[[str], object] = str
    # only where a job is looked up (status, list, ...): submit takes it from the spec instead
    lookup_only: bool = False


class Backend(abc.ABC):
    """A scheduler, in the manner of torchx's Scheduler: the glue is here, each backend fills in
    the small hooks below. A job is named by its handle (`handle()`, what `submit()` returns);
    the other verbs take the job's id within the backend (Handle.job_id).

    What a backend declares about itself (its options, its handle's fields, what its sweeps do)
    is read from the class, so the CLI and the API name no backend."""

    name: ClassVar[str]  # its registry name, and its handles' scheme
    summary: ClassVar[str] = ""  # a few words for --backend's help: "sbatch script", "detached processes"
    options: ClassVar[tuple[Option, ...]] = ()  # its constructor's options, as command-line flags
    handle_fields: ClassVar[tuple[str, ...]] = ()  # what a handle carries before the id: constructor keywords
    handle_id: ClassVar[str] = "ID"  # the id's placeholder in the handle's form (slurm://CLUSTER/ID)
    renders: ClassVar[bool] = True  # `render` prints its payload for the user to submit by hand
    runs_here: ClassVar[bool] = False  # `run` starts the job in the foreground, in this process
    sweep_summary: ClassVar[str] = "a job per trial"  # how it runs a sweep, for `sweep --backend`'s help
    # the fields of its own spec section as command-line flags, and their section of the help
    spec_flags: ClassVar[tuple[SpecFlag, ...]] = ()
    spec_flags_title: ClassVar[str] = ""
    # whether its jobs start with the submitter's environment (then spec.env over it), or with
    # spec.env alone (a pod's)
    inherits_environment: ClassVar[bool] = True

    @abc.abstractmethod
    def prepare(self, spec: JobSpec) -> Prepared:
        """The exact bytes `submit()` hands to the scheduler, nothing run or written: the dry run
        (a copy of the code the job runs from is planned here, Prepared.snapshot, and made by schedule)."""

    def schedule(self, prepared: Prepared) -> Handle:
        """Hand `prepared` to the scheduler as it is, then keep the new job in this machine's
        records (backends.records) as `submitted()` describes it; the new job's handle. Every
        job handed over comes through here: a submit, a sweep's trial, a SLURM array."""
        handle = self.hand_over(prepared)
        job = self.submitted(prepared, handle)
        if job is not None:
            records.record(job)
        return handle

    @abc.abstractmethod
    def hand_over(self, prepared: Prepared) -> Handle:
        """Give `prepared` to the scheduler as it is; the new job's handle."""

    @abc.abstractmethod
    def submitted(self, prepared: Prepared, handle: Handle) -> records.Submitted | None:
        """What this machine's records keep of a job just handed over: where its run directory
        (its logs, its job folder) is, as this host sees it. None where the scheduler keeps that
        itself, for any host that can reach it."""

    @abc.abstractmethod
    def handle(self, job_id: str) -> Handle:
        """The handle of job `job_id` (what it carries found out here: the cluster, the namespace)."""

    @abc.abstractmethod
    def status(self, job_id: str) -> JobStatus:
        """The job's state now, in the scheduler's word; BackendError where it knows no such job."""

    @abc.abstractmethod
    def list(self) -> builtins.list[JobStatus]:
        """The jobs dist-jobs submitted that the scheduler still knows, each with its handle."""

    @abc.abstractmethod
    def stop(self, job_id: str) -> None:
        """Stop job `job_id`, which `exists()` said there is."""

    @abc.abstractmethod
    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Rank `rank`'s lines as it wrote them, or every rank's as `[rank N] ...`; follow: until it ends."""

    @abc.abstractmethod
    def run_dir(self, job_id: str) -> Path:
        """`<checkpoint_dir>/<run>` as this host sees it; BackendError where it cannot say."""

    @abc.abstractmethod
    def owner(self, job_id: str) -> str | None:
        """The job as its trainer names itself in progress.json (None: whoever wrote it)."""

    def submit(self, spec: JobSpec) -> Handle:
        """Submit `spec`: the bytes of its dry run, handed over (torchx's schedule(dryrun(...)))."""
        prepared = self.prepare(spec)
        self.check_environment(prepared.spec)
        return self.schedule(prepared)

    def check_environment(self, spec: JobSpec) -> None:
        """Refuse lock knobs that do not fit together in the environment the job will have
        (rundir.lock.check_knobs): at submit, not after the job waited in a queue to be refused."""
        from dist_jobs.rundir.lock import check_knobs  # submit's alone: env and schema load no lock module

        check_knobs({**os.environ, **spec.env} if self.inherits_environment else spec.env)

    def render(self, spec: JobSpec) -> str:
        """What `dist-jobs render` prints: the payload, to submit by hand."""
        return self.prepare(spec).payload

    def check(self, prepared: Prepared) -> str | None:
        """What the scheduler says of `prepared` without running it; None: it has no such check."""
        return None

    def statuses(self, job_ids: builtins.list[str]) -> dict[str, JobStatus | DistJobsError]:
        """Each job's status, asking the scheduler as few times as it can (here: once per job); a
        job it cannot read gets its error. An error for all of them (no scheduler) is raised."""
        found: dict[str, JobStatus | DistJobsError] = {}
        for job_id in job_ids:
            try:
                found[job_id] = self.status(job_id)
            except DistJobsError as exc:  # one job it cannot read (a trial not started yet)
                found[job_id] = exc
        return found

    def exists(self, job_id: str) -> bool:
        """Whether there is a job `job_id` to stop; by default the scheduler says so when asked to stop it."""
        return True

    def cancel(self, job_id: str) -> None:
        """Stop the job; a BackendError when there is none to stop."""
        if not self.exists(job_id):
            raise BackendError(
                f"{self.name} job {job_id} is not running: nothing to cancel",
                f"see how it ended: dist-jobs status {self.handle(job_id)}",
            )
        self.stop(job_id)

    def foreground(self, spec: JobSpec, record: Path | None = None) -> int:
        """Run the job here, to its end; its exit code (`record`: the folder of a detached run,
        where the code goes). Only a backend that `runs_here` can."""
        raise UsageError(
            f"the {self.name} backend runs no job here", f"submit it: dist-jobs submit --backend {self.name}"
        )

    def log_ranks(self, spec: JobSpec) -> builtins.list[int] | None:
        """The ranks whose logs together hold every line (None: one log holds them all)."""
        return builtins.list(range(spec.world_size))

    @classmethod
    def handle_form(cls) -> str:
        """How its handles look: slurm://CLUSTER/ID."""
        return f"{cls.name}://" + "/".join([*(f.upper() for f in cls.handle_fields), cls.handle_id])

    @classmethod
    def parse_handle(cls, job_id: str, fields: dict[str, str]) -> Handle:
        """The handle with these parts (the text after the scheme, split at its fields); ValueError
        where they name no job of this backend (the registry's parse_handle says which forms do)."""
        if not job_id or not all(fields.values()):
            raise ValueError("a part of it is empty")
        return Handle(cls.name, job_id, **fields)

    # A sweep (dist_jobs.api.sweep_submit): by default one job per trial, all submitted at once.

    def snapshot(self, spec: JobSpec) -> JobSpec | None:
        """`spec` running from one copy of the code taken now, for every trial (as a job's own is:
        snapshot.plan, then take); None: each as it is."""
        return None

    def sweep_problems(self, max_parallel: int | None) -> builtins.list[Problem]:
        """What it cannot do with a sweep's `max_parallel` (by default: nothing)."""
        return []

    def trial_overrides(self, sweep: str, index: int) -> dict[str, str]:
        """Spec fields trial `index` of sweep `sweep` gets beyond its parameters."""
        return {}

    def prepare_sweep(
        self, name: str, params: builtins.list[dict[str, Any]], specs: builtins.list[JobSpec], max_parallel: int | None
    ) -> PreparedSweep:
        """The dry run of a sweep: each trial's own payload."""
        payloads = [(p.filename, p.payload) for p in map(self.prepare, specs)]
        text = "".join(f"# trial {i}: {s.run_id}\n{p}" for i, (s, (_, p)) in enumerate(zip(specs, payloads)))
        return PreparedSweep(name, self.name, params, specs, payloads, None, max_parallel, text)

    def sweep_roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        """(the folder of sweep `name`'s manifest, the trials' checkpoint root as the jobs see it)."""
        workdir = here / expand_home(first.workdir) if first.workdir else here  # where the trials run
        root = run_dir_of(first, workdir).root  # the trials' run directories are below it
        return root, str(root)

    def submit_sweep(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path) -> builtins.list[str]:
        """Submit the sweep its dry run planned (submit_sweep = schedule_sweep(prepare_sweep)):
        every trial's environment checked first, as submit() checks a job's; each trial's handle."""
        for spec in plan.specs:
            self.check_environment(spec)
        return self.schedule_sweep(plan, manifest, root)

    def schedule_sweep(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path) -> builtins.list[str]:
        """Hand the trials to the scheduler, each as its own job; each trial's handle, in order."""
        return [str(self.schedule(trial)) for trial in plan.trials()]

    def cancel_sweep(self, folder: Path, handles: builtins.list[str]) -> builtins.list[str] | None:
        """Stop what starts trials and cancel them at once where it can (the handles it
        cancelled); None: cancel the trials one by one."""
        return None

    def trial_not_started(self, run_dir: str) -> bool:
        """Whether a trial whose status cannot be read has simply not been started yet."""
        return False

    @classmethod
    def attach_options(cls, saved: Mapping[str, str]) -> dict[str, Any]:
        """The options a sweep's manifest saved, as the constructor takes them."""
        return {o.name: o.kind(saved[o.name]) for o in cls.options if saved.get(o.name)}
