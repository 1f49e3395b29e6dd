"""The Python API: what the CLI and a notebook call. One function per verb, backends chosen by name.

Everything heavy (kubernetes, submitit, torch) is imported inside the verbs that need it, so
`import dist_jobs` stays as light as `dist-jobs render`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.errors import DistJobsError, UsageError

if TYPE_CHECKING:  # each verb imports only what it uses: `status` needs no jinja2 or yaml
    from dist_jobs.backends import Backend, JobStatus, Prepared
    from dist_jobs.spec import JobSpec

__all__ = [
    "backend",
    "call_local",
    "cancel",
    "list_jobs",
    "load_spec",
    "logs",
    "prepare",
    "render",
    "run_local",
    "status",
    "submit",
]


def load_spec(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    backend: str | None = None,
) -> JobSpec:
    """Read `path` (or take `data`), apply dotted `overrides`; one SpecError lists every problem,
    those of `backend` (e.g. Kubernetes syntax for `k8s`) included."""
    from dist_jobs.spec import load_spec as load

    return load(path, overrides, data, backend)


def render(spec: JobSpec, backend_name: str) -> str:
    """The sbatch script (`slurm`) or manifest (`k8s`) for `spec`, exactly as submitted."""
    from dist_jobs.render import render as render_spec

    return render_spec(spec, backend_name)  # type: ignore[arg-type]


def backend(name: str, **options: Any) -> Backend:
    """A backend by name; options are its constructor's (namespace, kubeconfig, jobs_dir, ...)."""
    from dist_jobs.backends import get_backend

    return get_backend(name, **options)


def prepare(spec: JobSpec, backend_name: str, **options: Any) -> Prepared:
    """The dry run: the exact bytes `submit` would hand to the scheduler, nothing submitted."""
    return backend(backend_name, **options).prepare(spec)


def submit(spec: JobSpec, backend_name: str, **options: Any) -> str:
    """Submit `spec`; returns the scheduler's job id (SLURM) or name (Kubernetes)."""
    chosen = backend(backend_name, **options)
    return chosen.submit(chosen.prepare(spec))


def status(job_id: str, backend_name: str, **options: Any) -> JobStatus:
    return backend(backend_name, **options).status(job_id)


def list_jobs(backend_name: str, **options: Any) -> list[JobStatus]:
    return backend(backend_name, **options).list()


def cancel(job_id: str, backend_name: str, **options: Any) -> None:
    backend(backend_name, **options).cancel(job_id)


def logs(
    job_id: str, backend_name: str, rank: int | None = None, follow: bool = False, **options: Any
) -> Iterator[str]:
    return backend(backend_name, **options).logs(job_id, rank=rank, follow=follow)


def call_local(spec: JobSpec, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` on every rank of `spec` as local processes; rank 0's return value.

    Each rank gets torch's env:// variables and the job environment, as on a cluster, so a
    function that calls fit() resumes from the run's latest checkpoint. A rank that fails raises
    DistJobsError with its exit code (200: preempted and checkpointed; call again to resume).
    """
    try:
        import cloudpickle
    except ImportError:
        raise UsageError("call_local needs cloudpickle", hint="pip install 'dist-jobs[train]'") from None
    import tempfile

    import msgspec

    with tempfile.TemporaryDirectory(prefix=".dist-jobs-call-", dir=Path.cwd()) as folder:
        call, out = Path(folder) / "call.pkl", Path(folder) / "result.pkl"
        call.write_bytes(cloudpickle.dumps((fn, args, kwargs)))
        command = ["python3", "-m", "dist_jobs.train.call", str(call), str(out)]
        code = run_local(msgspec.structs.replace(spec, command=command))
        if code != 0:
            raise DistJobsError(
                f"{getattr(fn, '__name__', 'the function')} failed: exit code {code}",
                hint="its ranks' output above says why",
            )
        with out.open("rb") as f:
            return pickle.load(f)


def run_local(spec: JobSpec, workdir: Path | None = None) -> int:
    """Run the job here as local processes, to the end; the launcher's exit code."""
    from dist_jobs.backends.local import LocalBackend

    return LocalBackend(workdir=workdir).run(spec)
