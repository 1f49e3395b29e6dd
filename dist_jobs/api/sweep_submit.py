"""`dist_jobs.sweep(...)`: one spec, many trials, on every backend.

    sw = dist_jobs.sweep("job.yaml", grid={"train.lr": [0.1, 0.01], "train.batch_size": [64, 128]},
                         max_parallel=2, backend="slurm")
    sw.jobs          # one Job per trial (SLURM: the array's tasks, slurm://CLUSTER/ID_i)
    sw.status()      # one row per trial: params, state, step of total, latest and best metric

Each backend runs a sweep its own way (dist_jobs.backends.sweeps: SLURM one job array, Kubernetes
one labelled job per trial, local K trials at a time under a detached driver). The manifest
`<checkpoint_dir>/NAME/sweep.json` records the trials, their parameters and handles.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

from dist_jobs.api.sweep_status import Sweep
from dist_jobs.backends.sweeps import MANIFEST, PreparedSweep, sweeps_of, write_manifest
from dist_jobs.errors import Problem, SpecError
from dist_jobs.rundir.place import RunDir
from dist_jobs.spec import JobSpec, load_spec
from dist_jobs.spec import sweep as sweep_spec
from dist_jobs.spec.load import read_yaml
from dist_jobs.spec.sweep import RANGES, Range, overrides_for, parse_grid, sweep_root

KEPT_OPTIONS = ("jobs_dir", "cwd", "workdir", "context", "kubeconfig")  # what attaching to a trial needs
__all__ = ["Sweep", "SweepPlan", "plan_sweep", "sweep"]


SweepPlan = PreparedSweep  # the dry run: every trial's spec and the exact bytes submitted


def _raw(spec_or_path: Any) -> tuple[dict[str, Any], str]:
    """The base spec as data, unvalidated (every trial is validated), and where it came from."""
    if isinstance(spec_or_path, JobSpec):
        return msgspec.to_builtins(spec_or_path), "job spec"
    if spec_or_path is None:
        return {}, "flags"
    if isinstance(spec_or_path, dict):  # data already merged, e.g. a profile's under job.yaml's
        return dict(spec_or_path), "job spec"
    return read_yaml(Path(spec_or_path)), str(spec_or_path)


def _axes(grid: Mapping[str, Any]) -> dict[str, Any]:
    """Python values as grid axes: a list, a Range, a range text such as 'loguniform:1e-4:1e-1'."""
    out: dict[str, Any] = {}
    for key, value in grid.items():
        if isinstance(value, str) and value.partition(":")[0] in RANGES:
            out.update(parse_grid([f"{key}={value}"], lambda v, _: v))
        elif isinstance(value, Range):
            out[key] = value
        else:
            out[key] = list(value) if isinstance(value, (list, tuple, range)) else [value]
    return out


def plan_sweep(
    spec_or_path: Any,
    grid: Mapping[str, Any],
    random: int | None = None,
    seed: int = 0,
    max_parallel: int | None = None,
    backend: str = "local",
    overrides: Mapping[str, Any] | None = None,
    **options: Any,
) -> SweepPlan:
    """Every trial's spec, validated (all trials' problems raised once), and the payloads."""
    raw, source = _raw(spec_or_path)
    params = sweep_spec.trials(_axes(grid), random, seed)
    base = _base(raw, overrides, source)
    sweeps = sweeps_of(backend)
    problems = sweep_spec.name_problems(base.name, params) + (
        _parallel_problems(max_parallel) or sweeps.problems(max_parallel)
    )
    specs = _trial_specs(raw, base, dict(overrides or {}), params, backend, problems)
    if specs:
        problems += sweep_spec.base_problems(specs[0], backend)
        problems += sweep_spec.command_problems(params) if specs[0].command else []
    if problems:
        raise SpecError(sweep_spec.dedupe(problems), f"sweep {base.name} ({source})")
    return sweeps.prepare(base.name, params, specs, max_parallel, **options)


def _parallel_problems(max_parallel: int | None) -> list[Problem]:
    if max_parallel is not None and max_parallel < 1:
        return [Problem("--max-parallel", max_parallel, "must be at least 1", "give how many trials may run at once")]
    return []


def _base(raw: dict[str, Any], overrides: Mapping[str, Any] | None, source: str) -> Any:
    """The base spec's name and checkpoint root (as overridden), before anything is validated."""
    values = {"name": raw.get("name", "dist-job"), "checkpoint_dir": raw.get("checkpoint_dir", "checkpoints")}
    values |= {k: v for k, v in (overrides or {}).items() if k in values}
    return SimpleNamespace(name=str(values["name"]), checkpoint_dir=str(values["checkpoint_dir"]), source=source)


def _trial_specs(
    raw: dict[str, Any],
    base: Any,
    overrides: dict[str, Any],
    params: Sequence[Mapping[str, Any]],
    backend: str,
    problems: list[Problem],
) -> list[JobSpec]:
    root, specs, sweeps = sweep_root(base.checkpoint_dir, base.name), [], sweeps_of(backend)
    for index, values in enumerate(params):
        dotted = overrides | overrides_for(base.name, root, index, len(params), values)
        dotted |= sweeps.trial_overrides(base.name, index)
        try:
            specs.append(load_spec(data=raw, overrides=dotted, backend=backend))
        except SpecError as exc:
            problems += [p if p.field not in values else Problem(f"--grid {p.field}", *_rest(p)) for p in exc.problems]
    return specs


def _rest(p: Problem) -> tuple[object, str, str]:
    return p.value, p.message, p.hint


def sweep(
    spec_or_path: Any,
    grid: Mapping[str, Any] | None = None,
    random: int | None = None,
    seed: int = 0,
    max_parallel: int | None = None,
    backend: str = "local",
    overrides: Mapping[str, Any] | None = None,
    **options: Any,
) -> Sweep:
    """Submit a sweep; a Sweep with `.jobs` (one Job per trial) and `.status()`. On SLURM and
    locally every trial runs from one snapshot of the code (unless the spec says `snapshot: false`)."""
    if sweeps_of(backend).snapshots:
        overrides = _snapshot_overrides(spec_or_path, dict(overrides or {}), options, backend)
    plan = plan_sweep(spec_or_path, grid or {}, random, seed, max_parallel, backend, overrides, **options)
    here = Path(options.get("cwd") or options.get("workdir") or Path.cwd())
    root, runs = sweeps_of(backend).roots(plan.name, plan.head or plan.specs[0], here)
    manifest: dict[str, Any] = {
        "name": plan.name,
        "backend": backend,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "random": random,
        "seed": seed,
        "max_parallel": max_parallel,
        "options": {k: str(v) for k, v in options.items() if v and k in KEPT_OPTIONS},
        "trials": [
            {"index": i, "name": s.run_id, "params": p, "run_dir": str(RunDir.at(runs, s.run_id)), "handle": None}
            for i, (s, p) in enumerate(zip(plan.specs, plan.params))
        ],
    }
    handles = sweeps_of(backend).submit(plan, manifest, root, **options)
    for trial, handle in zip(manifest["trials"], handles):
        trial["handle"] = handle
    write_manifest(root, manifest)
    return Sweep(manifest, root / MANIFEST)


def _snapshot_overrides(
    spec_or_path: Any, overrides: dict[str, Any], options: Mapping[str, Any], backend: str
) -> dict[str, Any]:
    """`overrides` plus those that run every trial from one snapshot of the code, taken now, where
    the backend takes one (dist_jobs.backends.snapshot); unchanged when the spec or a flag turns
    snapshots off."""
    raw, _ = _raw(spec_or_path)
    base = load_spec(data=raw, overrides=overrides)
    if base.snapshot is False:
        return overrides
    snapped = sweeps_of(backend).snapshot(base, options)
    fields = {k: getattr(snapped, k) for k in ("workdir", "log_dir", "checkpoint_dir")}
    paths = {"env.PYTHONPATH": snapped.env["PYTHONPATH"]} if "PYTHONPATH" in snapped.env else {}
    return {**overrides, **fields, **paths, "snapshot": True}
