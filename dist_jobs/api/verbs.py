"""Submit and attach: the verbs that turn a spec or a handle into a Job (re-exported by dist_jobs.api).

Their own module so that a sweep (dist_jobs.api.sweep_submit, .sweep_status), which dist_jobs.api
loads on first use, submits and attaches its trials through the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dist_jobs.api.job import Job
from dist_jobs.backends import Backend, get_backend, parse_handle

if TYPE_CHECKING:  # the query verbs load no spec classes (msgspec)
    from dist_jobs.spec import JobSpec


def backend(name: str, **options: Any) -> Backend:
    """A backend by name; options are its constructor's (namespace, kubeconfig, jobs_dir, ...)."""
    return get_backend(name, **options)


def submit(spec: JobSpec, backend: str = "local", **options: Any) -> Job:
    """Submit `spec` to `backend` (slurm, k8s, local: detached processes); its Job handle.

    Args:
        spec: the job, from `load_spec`.
        backend: `slurm`, `k8s` or `local`.
        **options: the backend's constructor options (namespace, kubeconfig, jobs_dir, ...).

    Returns:
        The submitted job; `str(job)` is its handle, for `attach` from any shell or notebook.

    Raises:
        DistJobsError: the job was refused before it was handed over (a UsageError, e.g. a
            python without the trainer's packages) or the scheduler failed (a BackendError).
    """
    chosen = get_backend(backend, **options)
    return attach(str(chosen.submit(spec)), **options)


def attach(handle: str, **options: Any) -> Job:
    """The Job named by `handle` (as printed by submit), from any shell or notebook.

    Args:
        handle: `slurm://CLUSTER/ID`, `k8s://NAMESPACE/KIND/NAME` or `local:///RUN/DIR`.
        **options: the backend's constructor options; what the handle carries wins.

    Raises:
        UsageError: `handle` is not a handle.
    """
    return attach_all([handle], **options)[0]


def attach_all(handles: list[str], **options: Any) -> list[Job]:
    """attach() of each handle, with one backend per scheduler (backend and what its handles
    carry: namespace and kind, cluster), so a poll of many jobs asks each scheduler once."""
    made: dict[tuple[str, tuple[tuple[str, str], ...]], Backend] = {}
    jobs = []
    for handle in handles:
        parsed = parse_handle(handle)
        carried = parsed.options()
        key = (parsed.backend, tuple(sorted(carried.items())))
        if key not in made:
            made[key] = get_backend(parsed.backend, **{**options, **carried})
        jobs.append(Job(parsed, made[key]))
    return jobs
