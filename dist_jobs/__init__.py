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

import importlib
from typing import Any

from dist_jobs.constants import REQUEUE_EXIT_CODE as REQUEUE_EXIT_CODE
from dist_jobs.constants import VERSION
from dist_jobs.errors import BackendError as BackendError
from dist_jobs.errors import DistJobsError as DistJobsError
from dist_jobs.errors import RankError as RankError
from dist_jobs.errors import SpecError as SpecError
from dist_jobs.errors import UsageError as UsageError

__version__ = VERSION
"""The version of dist-jobs, e.g. "0.1.0"."""

# Every job script's `python3 -m dist_jobs.rundir...` imports this package first, so the API
# (dist_jobs.api) is loaded when one of its names is first asked for, not here: a tool of the run
# directory then loads none of it, and one the API imports (dist_jobs.rundir.attempts) runs under
# `-m` without runpy's "found in sys.modules" warning in the job's log.
_OWN = ["REQUEUE_EXIT_CODE", "__version__", "DistJobsError", "SpecError", "UsageError", "RankError", "BackendError"]


def __getattr__(name: str) -> Any:
    """The API's names (dist_jobs.api.__all__, the one list) and `__all__`, read when asked."""
    api = importlib.import_module("dist_jobs.api")
    if name == "__all__":
        return [*_OWN[:2], *api.__all__, *_OWN[2:]]
    if name in api.__all__:
        return getattr(api, name)
    if name in globals():  # a subpackage the API imports (dist_jobs.api, dist_jobs.backends, ...)
        return globals()[name]
    raise AttributeError(f"module 'dist_jobs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
