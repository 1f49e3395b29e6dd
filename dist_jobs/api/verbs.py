"""Submit and attach: the verbs that turn a spec or a handle into a Job (re-exported by dist_jobs.api).

Their own module so that a sweep (dist_jobs.api.sweep_submit, .sweep_status), which dist_jobs.api
loads on first use, submits and attaches its trials through the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dist_jobs.api.handle import Handle, handle_for, parse_handle
from dist_jobs.api.job import Job

if TYPE_CHECKING:
    from dist_jobs.backends import Backend
    from dist_jobs.spec import JobSpec


def backend(name: str, **options: Any) -> Backend:
    """A backend by name; options are its constructor's (namespace, kubeconfig, jobs_dir, ...)."""
    from dist_jobs.backends import get_backend

    return get_backend(name, **options)


_backend = backend  # `submit(spec, backend=...)` shadows the function inside the verbs


def submit(spec: JobSpec, backend: str = "local", **options: Any) -> Job:
    """Submit `spec` to `backend` (slurm, k8s, local: detached processes); its Job handle."""
    chosen = _backend(backend, **options)
    job_id = chosen.submit(chosen.prepare(spec))
    if backend == "k8s":
        kind = "TrainJob" if spec.k8s.api == "trainjob" else "PyTorchJob"
        ns = spec.k8s.namespace or chosen.namespace_in_use()  # type: ignore[attr-defined]  # where _create put it
        return Job(Handle("k8s", job_id, namespace=ns, kind=kind), _backend("k8s", **{**options, "kind": kind}))
    return Job(job_handle(backend, job_id, chosen), chosen)


def attach(handle: str, **options: Any) -> Job:
    """The Job named by `handle` (as printed by submit), from any shell or notebook."""
    parsed = parse_handle(handle)
    if parsed.backend == "k8s":
        options = {**options, "namespace": parsed.namespace, "kind": parsed.kind}
    return Job(parsed, _backend(parsed.backend, **options))


def attach_all(handles: list[str], **options: Any) -> list[Job]:
    """attach() of each handle, with one backend per scheduler (backend, namespace, kind), so a
    poll of many jobs asks each scheduler once (SlurmBackend.statuses)."""
    made: dict[tuple[str, str, str], Backend] = {}
    jobs = []
    for handle in handles:
        parsed = parse_handle(handle)
        extra = {"namespace": parsed.namespace, "kind": parsed.kind} if parsed.backend == "k8s" else {}
        key = (parsed.backend, parsed.namespace, parsed.kind)
        if key not in made:
            made[key] = _backend(parsed.backend, **{**options, **extra})
        jobs.append(Job(parsed, made[key]))
    return jobs


def job_handle(backend_name: str, job_id: str, chosen: Any) -> Handle:
    # SLURM's cluster name is asked for only when the handle is printed (Job.handle): a status
    # by bare id must not cost an extra scontrol call.
    if backend_name == "k8s":
        return handle_for("k8s", job_id, namespace=chosen.namespace_in_use(), kind=chosen.kind)
    return handle_for(backend_name, job_id)
