"""`dist_jobs.sweep(...)`: one spec, many trials, on every backend.

    sw = dist_jobs.sweep("job.yaml", grid={"train.lr": [0.1, 0.01], "train.batch_size": [64, 128]},
                         max_parallel=2, backend="slurm")
    sw.jobs          # one Job per trial (SLURM: the array's tasks, slurm://CLUSTER/ID_i)
    sw.status()      # one row per trial: params, state, step of total, latest and best metric

SLURM: ONE job array (`--array=0-(n-1)%K`), each task a whole multi-node job (render/sweep.py).
Kubernetes: one PyTorchJob per trial, labelled `dist-jobs/sweep: NAME` and `dist-jobs/trial: "i"`,
all created at once (`max_parallel` is refused: nothing would hold the rest back once this
process is gone; a queue such as Kueue, `k8s.queue` or its label, does that on the cluster).
Local: K trials at a time, each a full multi-process job, started by a detached driver
(`dist-jobs sweep --drive MANIFEST`) that outlives the shell, like `submit --backend local`.
The manifest `<checkpoint_dir>/NAME/sweep.json` records the trials, their parameters and handles.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.api.sweep_local import drive_local, start_driver, write_manifest
from dist_jobs.api.sweep_status import MANIFEST, SWEEPS_DIR, Sweep
from dist_jobs.api.verbs import submit
from dist_jobs.errors import Problem, SpecError
from dist_jobs.spec.paths import expand_home

if TYPE_CHECKING:
    from dist_jobs.spec import JobSpec

KEPT_OPTIONS = ("jobs_dir", "cwd", "workdir", "context", "kubeconfig")  # what attaching to a trial needs
__all__ = ["Sweep", "SweepPlan", "plan_sweep", "sweep", "drive_local"]


@dataclass(frozen=True)
class SweepPlan:
    """The dry run: every trial's spec and the exact bytes that would be submitted."""

    name: str
    backend: str
    params: list[dict[str, Any]]
    specs: list[JobSpec]
    payloads: list[tuple[str, str]]  # (file name, exact script or manifest)
    head: JobSpec | None  # SLURM: the array's own spec
    max_parallel: int | None

    @property
    def text(self) -> str:
        """What `--dry-run` prints: the one array script, the manifests as one YAML stream, or the local plans."""
        if self.backend == "slurm":
            return self.payloads[0][1]
        if self.backend == "k8s":
            return "---\n".join(payload for _, payload in self.payloads)
        return "".join(f"# trial {i}: {s.run_id}\n{p}" for i, (s, (_, p)) in enumerate(zip(self.specs, self.payloads)))


def _raw(spec_or_path: Any) -> tuple[dict[str, Any], str]:
    """The base spec as data, unvalidated (every trial is validated), and where it came from."""
    import msgspec

    from dist_jobs.spec import JobSpec
    from dist_jobs.spec.load import read_yaml

    if isinstance(spec_or_path, JobSpec):
        return msgspec.to_builtins(spec_or_path), "job spec"
    if spec_or_path is None:
        return {}, "flags"
    if isinstance(spec_or_path, dict):  # data already merged, e.g. a profile's under job.yaml's
        return dict(spec_or_path), "job spec"
    return read_yaml(Path(spec_or_path)), str(spec_or_path)


def _axes(grid: Mapping[str, Any]) -> dict[str, Any]:
    """Python values as grid axes: a list, a Range, a range text such as 'loguniform:1e-4:1e-1'."""
    from dist_jobs.spec.sweep import RANGES, Range, parse_grid

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
    from dist_jobs.spec import sweep as plan

    raw, source = _raw(spec_or_path)
    params = plan.trials(_axes(grid), random, seed)
    base = _base(raw, overrides, source)
    problems = plan.name_problems(base.name, params) + _parallel_problems(max_parallel, backend)
    specs = _trial_specs(raw, base, dict(overrides or {}), params, backend, problems)
    if specs:
        problems += plan.base_problems(specs[0], backend)
        problems += plan.command_problems(params) if specs[0].command else []
    if problems:
        raise SpecError(plan.dedupe(problems), f"sweep {base.name} ({source})")
    head = None
    if backend == "slurm":
        from dist_jobs.render.sweep import head_overrides, sweep_script

        root = plan.sweep_root(base.checkpoint_dir, base.name)
        head = _reload(specs[0], head_overrides(base.name, root, len(specs), max_parallel), backend)
        payloads = [(f"{head.run_id}.sbatch", sweep_script(head, specs))]
    else:
        from dist_jobs.backends import get_backend

        chosen = get_backend(backend, **options)
        payloads = [(p.filename, p.payload) for p in map(chosen.prepare, specs)]
    return SweepPlan(base.name, backend, params, specs, payloads, head, max_parallel)


def _reload(base: JobSpec, overrides: Mapping[str, Any], backend: str) -> JobSpec:
    import msgspec

    from dist_jobs.spec import load_spec

    return load_spec(data=msgspec.to_builtins(base), overrides=overrides, backend=backend)


def _parallel_problems(max_parallel: int | None, backend: str) -> list[Problem]:
    if max_parallel is None:
        return []
    if max_parallel < 1:
        return [Problem("--max-parallel", max_parallel, "must be at least 1", "give how many trials may run at once")]
    if backend == "k8s":
        return [
            Problem(
                "--max-parallel",
                max_parallel,
                "is not supported on Kubernetes: every trial's PyTorchJob is created at once",
                "leave it out; limit concurrency on the cluster with a queue (k8s.queue, or Kueue's "
                "kueue.x-k8s.io/queue-name label in k8s.labels)",
            )
        ]
    return []


def _base(raw: dict[str, Any], overrides: Mapping[str, Any] | None, source: str) -> Any:
    """The base spec's name and checkpoint root (as overridden), before anything is validated."""
    from types import SimpleNamespace

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
    from dist_jobs.spec import load_spec
    from dist_jobs.spec.sweep import overrides_for, sweep_root

    root, specs = sweep_root(base.checkpoint_dir, base.name), []
    for index, values in enumerate(params):
        dotted = overrides | overrides_for(base.name, root, index, len(params), values)
        if backend == "k8s":
            dotted |= {"k8s.labels.dist-jobs/sweep": base.name, "k8s.labels.dist-jobs/trial": str(index)}
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
    if backend in ("slurm", "local"):
        overrides = _snapshot_overrides(spec_or_path, dict(overrides or {}), options, backend)
    plan = plan_sweep(spec_or_path, grid or {}, random, seed, max_parallel, backend, overrides, **options)
    base_dir = Path(options.get("cwd") or options.get("workdir") or Path.cwd())
    first = plan.head or plan.specs[0]
    root = _absolute(first.checkpoint_dir, base_dir, first.workdir if backend == "slurm" else None)
    runs = str(root)
    if backend == "k8s":  # the checkpoint root is the pods' volume: the manifest stays here
        from dist_jobs.render.k8s import checkpoint_path

        root, runs = (base_dir / SWEEPS_DIR / plan.name).resolve(), checkpoint_path(first)
    manifest: dict[str, Any] = {
        "name": plan.name,
        "backend": backend,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "random": random,
        "seed": seed,
        "max_parallel": max_parallel,
        "options": {k: str(v) for k, v in options.items() if v and k in KEPT_OPTIONS},
        "trials": [
            {"index": i, "name": s.run_id, "params": p, "run_dir": posixpath.join(runs, s.run_id), "handle": None}
            for i, (s, p) in enumerate(zip(plan.specs, plan.params))
        ],
    }
    handles = _submit(plan, manifest, root, options)
    for trial, handle in zip(manifest["trials"], handles):
        trial["handle"] = handle
    write_manifest(root, manifest)
    return Sweep(manifest, root / MANIFEST)


def _snapshot_overrides(
    spec_or_path: Any, overrides: dict[str, Any], options: Mapping[str, Any], backend: str = "slurm"
) -> dict[str, Any]:
    """`overrides` plus those that run every trial from one snapshot of the code, taken now
    (dist_jobs.backends.snapshot); unchanged when the spec or a flag turns snapshots off. SLURM
    keeps it in its jobs dir; a local sweep in its own folder, `<checkpoint_dir>/NAME/snapshots/`
    (a local driver starts trials later: each must not take a copy of its own)."""
    from dist_jobs.backends.base import checkpoint_root
    from dist_jobs.backends.snapshot import spec_in_copy
    from dist_jobs.spec import load_spec

    raw, _ = _raw(spec_or_path)
    base = load_spec(data=raw, overrides=overrides)
    if base.snapshot is False:
        return overrides
    if backend == "slurm":
        from dist_jobs.backends.slurm import SlurmBackend
        from dist_jobs.backends.slurm.submit import snapshot_spec

        slurm = SlurmBackend(**options)
        snapped = snapshot_spec(base, slurm.cwd, slurm.jobs_dir)
    else:  # local: the code is the folder the trials would start in (LocalBackend's workdir)
        code = Path(options.get("workdir") or Path.cwd())
        snapped = spec_in_copy(base, code, checkpoint_root(base, code).resolve() / base.name)
    fields = {k: getattr(snapped, k) for k in ("workdir", "log_dir", "checkpoint_dir")}
    paths = {"env.PYTHONPATH": snapped.env["PYTHONPATH"]} if "PYTHONPATH" in snapped.env else {}
    return {**overrides, **fields, **paths, "snapshot": True}


def _absolute(folder: str, base: Path, workdir: str | None) -> Path:
    """`folder` as the jobs have it: `~` expanded here (as the renderers do), relative to the workdir."""
    path = Path(expand_home(folder))
    if path.is_absolute():
        return path
    return (base / expand_home(workdir) / path if workdir else base / path).resolve()


def _submit(plan: SweepPlan, manifest: dict[str, Any], root: Path, options: dict[str, Any]) -> list[str | None]:
    from dist_jobs.backends import Prepared
    from dist_jobs.spec.sweep import trial_name

    count = len(plan.specs)
    if plan.backend == "slurm":
        assert plan.head is not None
        from dist_jobs.backends.slurm import SlurmBackend
        from dist_jobs.backends.slurm.meta import record_trials

        chosen = SlurmBackend(**options)
        filename, payload = plan.payloads[0]
        array = chosen.submit(Prepared("slurm", plan.head, payload, filename))
        record_trials(chosen.jobs_dir, array.job_id, [s.run_id for s in plan.specs])
        return [str(chosen.handle(f"{array.job_id}_{i}")) for i in range(count)]
    if plan.backend == "local" and plan.max_parallel and plan.max_parallel < count:
        import msgspec

        manifest["specs"] = [msgspec.to_builtins(s) for s in plan.specs]
        manifest["trials"] = [{**t, "handle": f"local://{t['run_dir']}"} for t in manifest["trials"]]
        write_manifest(root, manifest)
        start_driver(root / MANIFEST, options)
        return [t["handle"] for t in manifest["trials"]]
    assert all(s.run_id == trial_name(plan.name, i, count) for i, s in enumerate(plan.specs))
    return [str(submit(spec, plan.backend, **options).handle) for spec in plan.specs]
