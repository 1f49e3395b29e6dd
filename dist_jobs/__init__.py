"""dist-jobs: one job spec becomes a SLURM batch script, a Kubeflow PyTorchJob, or local processes.

    import dist_jobs
    spec = dist_jobs.load_spec("job.yaml", {"nodes": 2})
    print(dist_jobs.render(spec, "slurm"))
    job = dist_jobs.submit(spec, backend="local")    # or "slurm", "k8s": a Job, printable handle
    print(job.result())                              # waits; JobFailed unless it succeeded

The names below are re-exported lazily from `dist_jobs.api`: `import dist_jobs` costs nothing
that `dist-jobs render` does not already pay, and imports no torch, kubernetes or submitit.
"""

from __future__ import annotations

from dist_jobs.constants import REQUEUE_EXIT_CODE, VERSION

# Not `from typing import ...`: the per-task launcher imports this package too, and typing costs
# it about 10 ms of start-up on every task. mypy honours a local TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__version__ = VERSION

_API = (
    "Job",
    "JobFailed",
    "JobInfo",
    "JobState",
    "WaitTimeout",
    "wait_all",
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
)
_ERRORS = ("DistJobsError", "SpecError", "UsageError", "RankError", "BackendError", "Preempted")

__all__ = ["REQUEUE_EXIT_CODE", "__version__", *_API, *_ERRORS]


def __getattr__(name: str) -> Any:
    if name in _API:
        from dist_jobs import api

        return getattr(api, name)
    if name in _ERRORS:
        from dist_jobs import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'dist_jobs' has no attribute {name!r}")
