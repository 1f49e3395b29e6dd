"""The Python API: what the CLI and a notebook call. One function per verb, backends chosen by name.

Everything heavy (kubernetes, submitit, torch) is imported inside the verbs that need it, so
`import dist_jobs` stays as light as `dist-jobs render`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # each verb imports only what it uses: `status` needs no jinja2 or yaml
    from dist_jobs.backends import Backend, JobStatus, Prepared
    from dist_jobs.spec import JobSpec

__all__ = ["backend", "cancel", "list_jobs", "load_spec", "logs", "prepare", "render", "run_local", "status", "submit"]


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


def run_local(spec: JobSpec, workdir: Path | None = None) -> int:
    """Run the job here as local processes, to the end; the launcher's exit code."""
    from dist_jobs.backends.local import LocalBackend

    return LocalBackend(workdir=workdir).run(spec)
