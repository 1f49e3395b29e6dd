"""The Python API: what the CLI and a notebook call. One function per verb, backends chosen by name.

kubernetes, submitit and torch are imported inside the verbs that need them (the render side
imports none), and the spec classes (msgspec), the renderer and a sweep's modules inside theirs:
the query verbs load none of them (tests/unit/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.api.job import Job, JobFailed, JobInfo, WaitTimeout, info_of, wait_all
from dist_jobs.api.verbs import attach, backend, submit
from dist_jobs.backends import Names as Names
from dist_jobs.backends import Prepared, handle_forms

# the registry, which the CLI reads for its flags, choices and hints (not the notebook API's __all__)
from dist_jobs.backends import backend_class as backend_class
from dist_jobs.backends import backend_classes as backend_classes
from dist_jobs.backends import backend_names as backend_names
from dist_jobs.backends import or_list as or_list
from dist_jobs.backends import parse_handle as parse_handle  # the CLI reads handles through the API
from dist_jobs.backends.handle import is_handle
from dist_jobs.backends.jobstate import JobState
from dist_jobs.errors import DistJobsError, Preempted, UsageError

if TYPE_CHECKING:  # the query verbs load no sweep modules and no spec classes (msgspec)
    from dist_jobs.api.sweep_status import Sweep
    from dist_jobs.api.sweep_submit import sweep
    from dist_jobs.spec import JobSpec


def __getattr__(name: str) -> Any:
    """`sweep` and `Sweep` on first use (PEP 562): the query verbs do without a sweep's modules."""
    if name == "sweep":
        from dist_jobs.api.sweep_submit import sweep  # on first use: the query verbs do without it

        return sweep
    if name == "Sweep":
        from dist_jobs.api.sweep_status import Sweep  # on first use, as sweep

        return Sweep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Job",
    "JobFailed",
    "JobInfo",
    "JobState",
    "Preempted",
    "WaitTimeout",
    "attach",
    "backend",
    "call_local",
    "cancel",
    "job",
    "list_jobs",
    "load_spec",
    "logs",
    "prepare",
    "render",
    "run_local",
    "status",
    "submit",
    "sweep",
    "Sweep",
    "wait_all",
]


def load_spec(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    backend: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> JobSpec:
    """Read `path` (or take `data`), apply dotted `overrides`; one SpecError lists every problem,
    those of `backend` (e.g. Kubernetes syntax for `k8s`) included.

    Args:
        path: the job.yaml to read; None to build the spec from `data` alone.
        overrides: dotted field paths and values, e.g. `{"train.epochs": 5}`, applied last.
        data: the spec as a mapping, instead of (or below) the file.
        backend: also check what this backend (`slurm`, `k8s`, `local`) needs.
        defaults: spec fields below the file's, e.g. a profile's (`load_profile(name).spec`,
            dist_jobs.spec.profiles).

    Returns:
        The checked job spec.

    Raises:
        SpecError: every problem found, each with its field, the given value and a fix.
    """
    from dist_jobs.spec.load import load_spec as load  # msgspec, yaml: not for the query verbs

    return load(path, overrides, data, backend, defaults)


def render(spec: JobSpec, backend_name: str) -> str:
    """What the backend would submit for `spec`, to submit by hand: the sbatch script (`slurm`),
    the manifest (`k8s`)."""
    return backend(backend_name).render(spec)


_backend = backend  # `list_jobs(backend=...)` shadows the function inside the verbs


def prepare(spec: JobSpec, backend_name: str, **options: Any) -> Prepared:
    """The dry run: the exact bytes `submit` would hand to the scheduler, nothing submitted."""
    return backend(backend_name, **options).prepare(spec)


def job(job_id: str, backend_name: str | None = None, **options: Any) -> Job:
    """A handle (`slurm://c/123`) or a bare id with its backend name, as a Job.

    Args:
        job_id: a handle as `submit` prints it, or the scheduler's own id.
        backend_name: the backend of a bare id (`slurm`, `k8s`, `local`); not needed for a handle.
        **options: the backend's constructor options (namespace, kubeconfig, ...).

    Returns:
        The Job; nothing is asked of the scheduler yet.

    Raises:
        UsageError: a bare id without `backend_name`, or a handle that does not parse.
    """
    if is_handle(job_id):
        return attach(job_id, **options)
    if backend_name is None:
        raise UsageError(
            f"{job_id!r} is a bare job id: which backend runs it?", f"pass --backend, or a handle: {handle_forms()}"
        )
    chosen = _backend(backend_name, **options)
    return Job(chosen.handle(job_id), chosen)


def status(job_id: str, backend_name: str | None = None, **options: Any) -> JobInfo:
    """The job's state now: `job(job_id, backend_name, **options).status()`.

    Raises:
        UsageError: a bare id without `backend_name`, or a handle that does not parse.
        BackendError: the scheduler could not be asked about the job.
    """
    return job(job_id, backend_name, **options).status()


def list_jobs(backend: str = "local", **options: Any) -> list[JobInfo]:
    """Jobs dist-jobs submitted that the backend still knows (SLURM: yours in the queue;
    Kubernetes: PyTorchJobs and TrainJobs unless `kind` is given; local: every one submitted
    from this machine whose run directory is still there, wherever its checkpoint_dir put it)."""
    return [info_of(s.handle, s) for s in _backend(backend, **options).list()]


def cancel(job_id: str, backend_name: str | None = None, **options: Any) -> None:
    """Cancel the job: `job(job_id, backend_name, **options).cancel()`."""
    job(job_id, backend_name, **options).cancel()


def logs(
    job_id: str, backend_name: str | None = None, rank: int | None = None, follow: bool = False, **options: Any
) -> Iterator[str]:
    """The job's log lines: `job(job_id, backend_name, **options).logs(rank, follow)`.

    Args:
        job_id: a handle, or a bare id with `backend_name`.
        backend_name: the backend of a bare id.
        rank: only this rank's lines; None: every rank's (Kubernetes: pod 0's).
        follow: keep yielding new lines until the job ends.
        **options: the backend's constructor options.
    """
    return job(job_id, backend_name, **options).logs(rank=rank, follow=follow)


def call_local(spec: JobSpec, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` on every rank of `spec` as local processes; rank 0's return value.

    Each rank gets torch's env:// variables and the job environment, as on a cluster, so a
    function that calls fit() resumes from the run's latest checkpoint. A rank that fails raises
    DistJobsError whose exit_code is the run's: Preempted (200) when it checkpointed after a
    preemption signal, so a script's `sys.exit(error.exit_code)` gets it requeued; call again
    to resume.
    """
    try:
        import cloudpickle  # an optional dependency ([train]), needed by this verb alone
    except ImportError:
        raise UsageError("call_local needs cloudpickle", hint="pip install 'dist-jobs[train]'") from None
    import pickle  # with tempfile: call_local's alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
    import tempfile

    import msgspec  # the spec classes' library: not for the query verbs

    with tempfile.TemporaryDirectory(prefix=".dist-jobs-call-", dir=Path.cwd()) as folder:
        call, out = Path(folder) / "call.pkl", Path(folder) / "result.pkl"
        call.write_bytes(cloudpickle.dumps((fn, args, kwargs)))
        command = ["python3", "-m", "dist_jobs.train.call", str(call), str(out)]
        code = run_local(msgspec.structs.replace(spec, command=command))
        if code != 0:
            raise _call_failed(getattr(fn, "__name__", "the function"), code)
        with out.open("rb") as f:
            return pickle.load(f)


def _call_failed(name: str, code: int) -> DistJobsError:
    """The error of a call_local whose ranks exited with `code`, carrying that code."""
    if code == Preempted.exit_code:
        return Preempted(
            f"{name} was preempted and checkpointed (exit {code})",
            "call it again (or exit with error.exit_code to be requeued): it resumes from its checkpoint",
        )
    error = DistJobsError(f"{name} failed: exit code {code}", hint="its ranks' output above says why")
    error.exit_code = code
    return error


def run_local(spec: JobSpec, workdir: Path | None = None) -> int:
    """Run the job here as local processes, to the end; the launcher's exit code."""
    from dist_jobs.backends.local.runner import LocalRunner  # msgspec: not for the query verbs

    return LocalRunner(workdir=workdir).run(spec)
