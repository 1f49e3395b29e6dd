"""Job handles: one printable string that names a job on any backend, in one grammar:

    <backend>://<field>/.../<job id>

Each backend declares its handles' fields (`Backend.handle_fields`) and checks their values
(`Backend.parse_handle`); dist_jobs.backends.parse_handle splits a handle by the fields its
scheme's backend declares. The ones built in:

    slurm://<cluster>/<job id>
    k8s://<namespace>/<kind>/<name>        (kind: PyTorchJob or TrainJob)
    local://<run dir>                      (an absolute path: local:///home/me/checkpoints/run)

`dist-jobs status|logs|cancel|wait HANDLE` and `dist_jobs.attach(HANDLE)` take the backend and
everything it needs to find the job from the handle alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, init=False)
class Handle:
    backend: str  # its backend's registry name: the scheme
    job_id: str  # the job's id within its backend (SLURM job id, Kubernetes name, local run directory)
    fields: tuple[tuple[str, str], ...]  # what else the backend needs to find it, in the handle's order

    def __init__(self, backend: str, job_id: str, **fields: str) -> None:
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "fields", tuple(fields.items()))

    def __str__(self) -> str:
        return f"{self.backend}://" + "/".join([*(value for _, value in self.fields), self.job_id])

    def options(self) -> dict[str, str]:
        """What the handle tells its backend's constructor beyond the id (Kubernetes: where the
        job lives and what kind it is; SLURM: its cluster, so printing the handle asks nothing)."""
        return dict(self.fields)


def is_handle(text: str) -> bool:
    return "://" in text


def split_handle(text: str, fields: tuple[str, ...]) -> tuple[str, dict[str, str]] | None:
    """(job id, {field: value}) of `text` after its scheme, its first parts being `fields`; None
    when it has too few parts. The id is the rest (a local run directory's slashes included)."""
    _, _, rest = text.partition("://")
    parts = rest.split("/", len(fields)) if fields else [rest]
    if len(parts) != len(fields) + 1:
        return None
    return parts[-1], dict(zip(fields, parts[:-1]))
