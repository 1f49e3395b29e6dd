"""What each backend does for a sweep (dist_jobs.sweep): one interface, one implementation per
backend package (`slurm/sweep.py`: one job array; `k8s/sweep.py`: one labelled job per trial;
`local/sweep.py`: K trials at a time under a detached driver), so the API keeps no branches.

A sweep's folder holds its manifest, `sweep.json`: the trials, their parameters and handles.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dist_jobs.backends import BACKENDS, get_backend
from dist_jobs.backends.base import Prepared
from dist_jobs.errors import Problem, UsageError
from dist_jobs.rundir.atomic import write_atomic

if TYPE_CHECKING:
    from dist_jobs.spec import JobSpec  # msgspec: `sweep status` does without the spec classes

MANIFEST = "sweep.json"
SWEEPS_DIR = "dist-jobs-sweeps"  # Kubernetes sweeps: their manifests, here (the checkpoints are in the pods' volume)


@dataclass(frozen=True)
class PreparedSweep:
    """The dry run: every trial's spec and the exact bytes that would be submitted."""

    name: str
    backend: str
    params: list[dict[str, Any]]
    specs: list[JobSpec]
    payloads: list[tuple[str, str]]  # (file name, exact script or manifest)
    head: JobSpec | None  # SLURM: the array's own spec
    max_parallel: int | None
    text: str  # what `--dry-run` prints

    def trials(self) -> list[Prepared]:
        """Each trial as submit() takes it, for backends that submit a job per trial: the bytes
        the dry run showed, not a second rendering of each trial."""
        pairs = zip(self.specs, self.payloads, strict=True)
        return [Prepared(self.backend, spec, payload, filename) for spec, (filename, payload) in pairs]


class Sweeps(Protocol):
    snapshots: bool  # whether every trial runs from one copy of the code taken at submit (snapshot())

    def problems(self, max_parallel: int | None) -> list[Problem]:
        """What this backend cannot do with `max_parallel` (Kubernetes: hold trials back)."""
        ...

    def trial_overrides(self, name: str, index: int) -> dict[str, str]:
        """Spec fields every trial of sweep `name` gets beyond its parameters (Kubernetes: labels)."""
        ...

    def snapshot(self, base: JobSpec, options: Mapping[str, Any]) -> JobSpec:
        """`base` running from one copy of the code taken now, for every trial."""
        ...

    def prepare(
        self, name: str, params: list[dict[str, Any]], specs: list[JobSpec], max_parallel: int | None, **options: Any
    ) -> PreparedSweep: ...

    def roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        """(the folder of sweep `name`'s manifest, the trials' checkpoint root as the jobs see it)."""
        ...

    def submit(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path, **options: Any) -> list[str]:
        """Submit every trial; each trial's handle, in order."""
        ...

    def attach_options(self, saved: Mapping[str, str]) -> dict[str, Any]:
        """The backend options a manifest saved, as the backend takes them."""
        ...

    def cancel(self, folder: Path, handles: list[str], options: Mapping[str, Any]) -> list[str] | None:
        """Stop what starts trials and cancel them at once where the backend can (the handles it
        cancelled); None: cancel the trials one by one."""
        ...

    def not_started(self, run_dir: str) -> bool:
        """Whether a trial whose status cannot be read has simply not been started yet."""
        ...


def sweeps_of(backend: str) -> Sweeps:
    """The sweep side of backend `backend` (its package imported now)."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", "use --backend slurm, k8s or local")
    found: Sweeps = importlib.import_module(f"dist_jobs.backends.{backend}.sweep").SWEEPS
    return found


def write_manifest(root: Path, manifest: Mapping[str, Any]) -> Path:
    return write_atomic(root / MANIFEST, json.dumps(manifest, indent=2) + "\n", mkdir=True)


def prepare_each(backend_name: str, specs: list[JobSpec], **options: Any) -> list[tuple[str, str]]:
    """Each trial's own payload, as `prepare()` makes it (Kubernetes and local sweeps)."""
    chosen = get_backend(backend_name, **options)
    return [(p.filename, p.payload) for p in map(chosen.prepare, specs)]
