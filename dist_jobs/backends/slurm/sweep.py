"""A sweep on SLURM: ONE job array (`--array=0-(n-1)%K`), each task a whole multi-node job
(render/sweep.py), every trial running from one snapshot of the code unless the spec says not."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from dist_jobs.backends.base import Prepared, run_dir_of
from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.backends.slurm.meta import record_trials
from dist_jobs.backends.slurm.submit import snapshot_spec, workdir_of
from dist_jobs.backends.sweeps import PreparedSweep
from dist_jobs.errors import DistJobsError, Problem
from dist_jobs.render.sweep import head_overrides, sweep_script
from dist_jobs.spec import JobSpec
from dist_jobs.spec.load import load_spec


class SlurmSweeps:
    snapshots = True

    def problems(self, max_parallel: int | None) -> list[Problem]:
        return []  # the array's %K holds the rest back

    def trial_overrides(self, name: str, index: int) -> dict[str, str]:
        return {}

    def snapshot(self, base: JobSpec, options: Mapping[str, Any]) -> JobSpec:
        slurm = SlurmBackend(**options)
        return snapshot_spec(base, slurm.cwd, slurm.jobs_dir)

    def prepare(
        self, name: str, params: list[dict[str, Any]], specs: list[JobSpec], max_parallel: int | None, **options: Any
    ) -> PreparedSweep:
        overrides = head_overrides(name, specs[0].checkpoint_dir, len(specs), max_parallel)
        head = load_spec(data=msgspec.to_builtins(specs[0]), overrides=overrides, backend="slurm")
        script = sweep_script(head, specs)
        return PreparedSweep(
            name, "slurm", params, specs, [(f"{head.run_id}.sbatch", script)], head, max_parallel, script
        )

    def roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        root = run_dir_of(first, workdir_of(first, here)).root  # the trials' run directories are below it
        return root, str(root)

    def submit(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path, **options: Any) -> list[str]:
        assert plan.head is not None
        slurm = SlurmBackend(**options)
        filename, payload = plan.payloads[0]
        array = slurm.submit(Prepared("slurm", plan.head, payload, filename))
        record_trials(slurm.jobs_dir, array.job_id, [s.run_id for s in plan.specs])
        return [str(slurm.handle(f"{array.job_id}_{i}")) for i in range(len(plan.specs))]

    def attach_options(self, saved: Mapping[str, str]) -> dict[str, Any]:
        return {k: Path(saved[k]) for k in ("jobs_dir", "cwd") if saved.get(k)}

    def cancel(self, folder: Path, handles: list[str], options: Mapping[str, Any]) -> list[str] | None:
        array = handles[0].rsplit("/", 1)[1].split("_")[0]
        try:
            SlurmBackend(**options).cancel(array)  # the whole array, one scancel
        except DistJobsError:
            return []  # the whole array has ended already
        return handles

    def not_started(self, run_dir: str) -> bool:
        return False  # a pending array task is a job squeue lists


SWEEPS = SlurmSweeps()
