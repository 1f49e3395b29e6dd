"""A submitted sweep: its manifest (`<checkpoint_dir>/NAME/sweep.json`), its jobs, its status.

Each trial's row: its parameters, state (the scheduler's, through the trial's Job), step of
total, and the latest and best value of one metric. The numbers come from the trial's run
directory: `progress.json` and `metrics.jsonl` while it runs (dist_jobs.rundir.progress), else
the final `result.json` that fit() leaves (step and final metrics). The default metric is
`eval_loss` where a trial reports it, else `loss` (`train_loss` in result.json), minimised.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.api.job import WaitTimeout, statuses
from dist_jobs.api.polling import poll_until
from dist_jobs.api.verbs import attach_all
from dist_jobs.backends import Backend, backend_class, get_backend
from dist_jobs.backends.sweep_manifest import MANIFEST, SWEEPS_DIR
from dist_jobs.errors import DistJobsError, UsageError
from dist_jobs.rundir.progress import read_history, read_progress
from dist_jobs.rundir.result import read_result
from dist_jobs.spec.paths import expand_home

if TYPE_CHECKING:
    from dist_jobs.api.job import Job, JobInfo

DEFAULT_METRICS = ("eval_loss", "loss")
ENDED = ("succeeded", "failed", "cancelled")


@dataclass
class TrialRow:
    index: int
    name: str
    params: dict[str, Any]
    handle: str | None
    state: str
    detail: str = ""
    step: int | None = None
    total_steps: int | None = None
    metric: str | None = None
    latest: float | None = None
    best: float | None = None
    is_best: bool = False
    run_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # not dataclasses.asdict: its deep copy of every field took most of a 100-trial status
        return {**vars(self), "params": dict(self.params), "extra": dict(self.extra)}


def manifest_path(name_or_path: str, checkpoint_dir: str = "checkpoints") -> Path:
    """The manifest of sweep NAME under `checkpoint_dir`, or the sweep folder / sweep.json given."""
    given = Path(name_or_path).expanduser()
    local = Path(expand_home(checkpoint_dir)) / name_or_path / MANIFEST
    for candidate in (given, given / MANIFEST, local, Path(SWEEPS_DIR) / name_or_path / MANIFEST):
        if candidate.name == MANIFEST and candidate.is_file():
            return candidate.resolve()
    raise UsageError(
        f"no sweep {name_or_path!r}: no {Path(checkpoint_dir) / name_or_path / MANIFEST}",
        "run this where you ran `dist-jobs sweep`, pass --checkpoint-dir DIR (the spec's checkpoint_dir), "
        "or give the sweep's folder",
    )


class Sweep:
    """One handle on a sweep: its trials' Jobs and a status table."""

    def __init__(self, manifest: Mapping[str, Any], path: Path) -> None:
        self.manifest = dict(manifest)
        self.path = path

    @classmethod
    def load(cls, name_or_path: str, checkpoint_dir: str = "checkpoints") -> Sweep:
        path = manifest_path(name_or_path, checkpoint_dir)
        return cls(json.loads(path.read_text()), path)

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def backend(self) -> str:
        return str(self.manifest["backend"])

    @property
    def trials(self) -> list[dict[str, Any]]:
        return list(self.manifest["trials"])

    def __repr__(self) -> str:
        return f"Sweep({self.name!r}, {len(self.trials)} trials on {self.backend})"

    @property
    def handles(self) -> list[str]:
        """Each trial's job handle, in trial order (SLURM: slurm://CLUSTER/ARRAY_I)."""
        return [str(t["handle"]) for t in self.trials]

    @property
    def jobs(self) -> list[Job]:
        """One Job per trial, in trial order (the existing Job class: status, wait, logs, cancel)."""
        options = self._options()
        return attach_all([t["handle"] for t in self.trials], **options)  # one query per scheduler and poll

    def _options(self) -> dict[str, Any]:
        return backend_class(self.backend).attach_options(self.manifest.get("options", {}))

    def _backend(self) -> Backend:
        return get_backend(self.backend, **self._options())

    def cancel(self) -> list[str]:
        """Stop the sweep: no trial starts any more, and every trial that has not ended is
        cancelled (SLURM: the whole array, one scancel). The handles it cancelled."""
        done = self._backend().cancel_sweep(self.path.parent, self.handles)
        if done is not None:
            return done
        cancelled = []
        for job in self.jobs:
            try:
                if not job.status().finished:
                    job.cancel()
                    cancelled.append(job.handle)
            except DistJobsError:
                continue  # not started (a local trial the driver never started) or gone
        return cancelled

    def wait(self, timeout: float | None = None, poll: float | None = None, **status: Any) -> list[TrialRow]:
        """Until every trial has ended (succeeded, failed or cancelled); its status rows then.
        WaitTimeout after `timeout` seconds; `status` goes to status() (metric, mode). The same
        loop as Job.wait: one scheduler query per poll, pauses backing off from `poll` seconds."""

        def check() -> tuple[bool, list[TrialRow]]:
            rows = self.status(**status)
            return all(r.state in ENDED for r in rows), rows

        def expired(rows: list[TrialRow]) -> DistJobsError:
            left = sum(r.state not in ENDED for r in rows)
            return WaitTimeout(
                f"sweep {self.name}: {left} of {len(rows)} trials still not ended after {timeout:g} s",
                f"wait longer, or look at them: dist-jobs sweep status {self.name}",
            )

        return poll_until(check, timeout, expired, poll)

    def status(self, metric: str | None = None, mode: str = "min") -> list[TrialRow]:
        """One row per trial; the best trial (by `metric`, `mode` min or max) has is_best."""
        if mode not in ("min", "max"):
            raise UsageError(f"mode {mode!r}: the best trial has the least or the most", "give mode 'min' or 'max'")
        found = statuses(self.jobs)  # SLURM: one squeue and one sacct for every trial
        rows = [self._row(t, info, metric, mode) for t, info in zip(self.trials, found)]
        scored = [r for r in rows if r.best is not None and math.isfinite(r.best)]
        if scored:
            pick = min if mode == "min" else max
            pick(scored, key=lambda r: r.best if r.best is not None else 0.0).is_best = True
        return rows

    def _row(self, trial: Mapping[str, Any], info: JobInfo | DistJobsError, metric: str | None, mode: str) -> TrialRow:
        row = TrialRow(trial["index"], trial["name"], dict(trial["params"]), trial.get("handle"), "unknown")
        row.run_dir = trial.get("run_dir", "")
        if isinstance(info, DistJobsError):
            not_started = self._backend().trial_not_started(row.run_dir)
            row.state, row.detail = ("pending", "not started yet") if not_started else ("unknown", info.message)
        else:
            row.state, row.detail = info.state.value, info.detail
        _numbers(row, Path(row.run_dir), metric, mode)
        return row


def _numbers(row: TrialRow, run_dir: Path, metric: str | None, mode: str) -> None:
    """Step of total and the metric, from progress.json + metrics.jsonl, else result.json."""
    progress = read_progress(run_dir)
    if progress is not None:
        row.step, row.total_steps = _int(progress.get("step")), _int(progress.get("total_steps"))
        latest = _metrics(progress.get("metrics"))
        history = [_metrics(r.get("metrics")) for r in read_history(run_dir)] + [latest]
        row.extra = {k: progress[k] for k in ("epoch", "samples_per_s", "eta_s", "attempt") if k in progress}
    else:
        final = _result(run_dir)  # a finished run without progress files: its final metrics
        if final is None:
            return
        latest, history = final, [final]
        row.step = row.total_steps = _int(final.get("step"))
    name = _metric_name(metric, latest)
    if name is None:
        return
    row.metric = name
    row.latest = latest.get(name)
    values = [v for m in history if (v := m.get(name)) is not None and math.isfinite(v)]
    row.best = (min if mode == "min" else max)(values) if values else None


def _metric_name(metric: str | None, latest: Mapping[str, float]) -> str | None:
    candidates = [metric, f"train_{metric}"] if metric else [*DEFAULT_METRICS, "train_loss"]
    return next((c for c in candidates if c and c in latest), metric)


def _metrics(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _result(run_dir: Path) -> dict[str, float] | None:
    try:
        data = read_result(run_dir)
    except (DistJobsError, OSError, ValueError, TypeError):  # none yet, unreadable, not a JSON object
        return None
    return _metrics(data)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
