"""The backends layer: one interface (`base.Backend`), a registry, and the concrete backends.

Each backend is a package (`slurm/`, `k8s/`, `local/`) imported on demand: a SLURM verb must not
pay for kubernetes, nor `render` for any backend.
"""

from __future__ import annotations

import importlib

from dist_jobs.backends.base import Backend, JobStatus, Prepared
from dist_jobs.errors import UsageError

BACKENDS = ("slurm", "k8s", "local")

__all__ = ["BACKENDS", "Backend", "JobStatus", "Prepared", "backend_class", "get_backend"]


def get_backend(name: str, **options: object) -> Backend:
    """The backend called `name`, built with its constructor options (runner, API client, folders)."""
    backend: type[Backend] = backend_class(name)
    return backend(**options)


def backend_class(name: str) -> type[Backend]:
    """The Backend class of `name`, its package imported now (kubernetes only for `k8s`)."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}", "use --backend slurm, k8s or local")
    found: type[Backend] = importlib.import_module(f"dist_jobs.backends.{name}").BACKEND
    return found
