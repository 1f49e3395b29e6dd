"""A sweep on Kubernetes: one PyTorchJob per trial, labelled `dist-jobs/sweep: NAME` and
`dist-jobs/trial: "i"`, all created at once. `max_parallel` is refused: nothing would hold the
rest back once this process is gone; a queue such as Kueue (`k8s.queue` or its label) does that
on the cluster. The checkpoint root is the pods' volume, so the manifest stays here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dist_jobs.backends.k8s.backend import K8sBackend
from dist_jobs.backends.sweeps import SWEEPS_DIR, PreparedSweep, prepare_each
from dist_jobs.errors import Problem
from dist_jobs.render.k8s import checkpoint_path
from dist_jobs.spec import JobSpec


class K8sSweeps:
    snapshots = False

    def problems(self, max_parallel: int | None) -> list[Problem]:
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

    def trial_overrides(self, name: str, index: int) -> dict[str, str]:
        return {"k8s.labels.dist-jobs/sweep": name, "k8s.labels.dist-jobs/trial": str(index)}

    def snapshot(self, base: JobSpec, options: Mapping[str, Any]) -> JobSpec:
        # never asked (snapshots is False): the image holds the code; `snapshot: true` gives a
        # trial a ConfigMap of its own (backends.k8s.code)
        return base

    def prepare(
        self, name: str, params: list[dict[str, Any]], specs: list[JobSpec], max_parallel: int | None, **options: Any
    ) -> PreparedSweep:
        payloads = prepare_each("k8s", specs, **options)
        text = "---\n".join(payload for _, payload in payloads)
        return PreparedSweep(name, "k8s", params, specs, payloads, None, max_parallel, text)

    def roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        return (here / SWEEPS_DIR / name).resolve(), checkpoint_path(first)

    def submit(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path, **options: Any) -> list[str]:
        k8s = K8sBackend(**options)
        return [str(k8s.schedule(trial)) for trial in plan.trials()]

    def attach_options(self, saved: Mapping[str, str]) -> dict[str, Any]:
        return {k: saved[k] for k in ("context", "kubeconfig") if saved.get(k)}

    def cancel(self, folder: Path, handles: list[str], options: Mapping[str, Any]) -> list[str] | None:
        return None  # one job per trial: each is cancelled on its own

    def not_started(self, run_dir: str) -> bool:
        return False


SWEEPS = K8sSweeps()
