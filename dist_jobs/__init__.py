"""dist-jobs: one job spec becomes a SLURM batch script, a Kubeflow PyTorchJob, or local processes.

    import dist_jobs
    spec = dist_jobs.load_spec("job.yaml", {"nodes": 2})
    print(dist_jobs.render(spec, "slurm"))
    job = dist_jobs.submit(spec, backend="local")    # or "slurm", "k8s": a Job, printable handle
    print(job.result())                              # waits; JobFailed unless it succeeded

The names are dist_jobs.api's (listed once, in its `__all__`) and the errors'. `import dist_jobs`
imports no torch, kubernetes or submitit.
"""

from __future__ import annotations

from typing import Any

from dist_jobs import api
from dist_jobs.constants import REQUEUE_EXIT_CODE, VERSION
from dist_jobs.errors import BackendError, DistJobsError, RankError, SpecError, UsageError

__version__ = VERSION
"""The version of dist-jobs, e.g. "0.1.0"."""

__all__ = [
    "REQUEUE_EXIT_CODE",
    "__version__",
    *api.__all__,
    "DistJobsError",
    "SpecError",
    "UsageError",
    "RankError",
    "BackendError",
]


def __getattr__(name: str) -> Any:
    """The API's names (dist_jobs.api.__all__, the one list), read from it when asked."""
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'dist_jobs' has no attribute {name!r}")
