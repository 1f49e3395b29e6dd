"""The backends layer: one interface (`base.Backend`), a registry, and the concrete backends.

Concrete backends are imported on demand: `render` must not pay for kubernetes or submitit.
"""

from __future__ import annotations

from dist_jobs.backends.base import Backend, JobStatus, Prepared

__all__ = ["Backend", "JobStatus", "Prepared", "get_backend"]


def get_backend(name: str, **options: object) -> Backend:
    """The backend called `name`, built with its constructor options (runner, API client, folders)."""
    from dist_jobs.errors import UsageError

    if name == "slurm":
        from dist_jobs.backends.slurm import SlurmBackend

        return SlurmBackend(**options)  # type: ignore[arg-type]
    if name == "k8s":
        from dist_jobs.backends.k8s import K8sBackend

        return K8sBackend(**options)  # type: ignore[arg-type]
    if name == "local":
        from dist_jobs.backends.local_jobs import LocalJobs

        return LocalJobs(**options)  # type: ignore[arg-type]
    raise UsageError(f"unknown backend {name!r}", "use --backend slurm, k8s or local")
