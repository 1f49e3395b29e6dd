"""Job handles: one printable string that names a job on any backend (each backend makes its
jobs' handles: `Backend.handle(job_id)`; this module is their one grammar).

    slurm://<cluster>/<job id>
    k8s://<namespace>/<kind>/<name>        (kind: PyTorchJob or TrainJob)
    local://<run dir>                      (an absolute path: local:///home/me/checkpoints/run)

`dist-jobs status|logs|cancel|wait HANDLE` and `dist_jobs.attach(HANDLE)` take the backend and
everything it needs to find the job from the handle alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dist_jobs.errors import UsageError

K8S_KINDS = ("PyTorchJob", "TrainJob")
FORMS = "slurm://CLUSTER/ID, k8s://NAMESPACE/KIND/NAME or local:///RUN/DIR"


@dataclass(frozen=True)
class Handle:
    backend: str  # slurm | k8s | local
    job_id: str  # SLURM job id, Kubernetes object name, local run directory
    cluster: str = ""  # SLURM
    namespace: str = ""  # Kubernetes
    kind: str = ""  # Kubernetes

    def __str__(self) -> str:
        if self.backend == "slurm":
            return f"slurm://{self.cluster or 'default'}/{self.job_id}"
        if self.backend == "k8s":
            return f"k8s://{self.namespace or 'default'}/{self.kind or 'PyTorchJob'}/{self.job_id}"
        return f"local://{self.job_id}"

    def options(self) -> dict[str, str]:
        """What the handle tells its backend's constructor beyond the id (Kubernetes: where the
        job lives and what kind it is; SLURM: its cluster, so printing the handle asks nothing)."""
        if self.backend == "k8s":
            return {"namespace": self.namespace, "kind": self.kind}
        if self.backend == "slurm":
            return {"cluster": self.cluster}
        return {}


def is_handle(text: str) -> bool:
    return "://" in text


def parse_handle(text: str) -> Handle:
    """The Handle in `text`; a UsageError naming the expected forms if it is not one."""
    scheme, sep, rest = text.partition("://")
    parts = rest.split("/") if sep else []
    if scheme == "slurm" and len(parts) == 2 and all(parts) and parts[1].replace("_", "").isdigit():
        return Handle("slurm", parts[1], cluster=parts[0])
    if scheme == "k8s" and len(parts) == 3 and all(parts):
        kind = {k.lower(): k for k in K8S_KINDS}.get(parts[1].lower())
        if kind is None:
            raise UsageError(f"job handle {text!r}: unknown kind {parts[1]!r}", f"use one of {', '.join(K8S_KINDS)}")
        return Handle("k8s", parts[2], namespace=parts[0], kind=kind)
    if scheme == "local" and rest.startswith("/"):
        return Handle("local", str(Path(rest)))
    raise UsageError(f"{text!r} is not a job handle", f"a handle looks like {FORMS}")
