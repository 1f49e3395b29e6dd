"""A sweep on Kubernetes: one PyTorchJob per trial, labelled `dist-jobs/sweep: NAME` and
`dist-jobs/trial: "i"`, all created at once (K8sBackend's sweep hooks). `max_parallel` is
refused: nothing would hold the rest back once this process is gone; a queue such as Kueue
(`k8s.queue` or its label) does that on the cluster. The checkpoint root is the pods' volume, so
the manifest stays here."""

from __future__ import annotations

from pathlib import Path

from dist_jobs.backends.sweep_manifest import SWEEPS_DIR
from dist_jobs.errors import Problem
from dist_jobs.render.k8s import checkpoint_path
from dist_jobs.spec import JobSpec


def problems(max_parallel: int | None) -> list[Problem]:
    if max_parallel is None:
        return []
    return [
        Problem(
            "--max-parallel",
            max_parallel,
            "is not supported on Kubernetes: every trial's PyTorchJob is created at once",
            "leave it out; limit concurrency on the cluster with a queue (k8s.queue, or Kueue's "
            "kueue.x-k8s.io/queue-name label in k8s.labels)",
        )
    ]


def roots(name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
    """The manifest here (under dist-jobs-sweeps/NAME); the runs in the pods' volume."""
    return (here / SWEEPS_DIR / name).resolve(), checkpoint_path(first)
