"""`dist-jobs plot HANDLE -o run.png`: a run as a picture, every attempt of it.

Three panels over the optimizer step: train and eval loss, throughput (optimizer steps a second,
from the times rank 0 logged them), train and eval accuracy; each attempt in its own colour
(from the goodput ledger's starts), a dashed line where an attempt resumed from a checkpoint, and
a cross with the verdict where an attempt ended in a fault ("rank killed", "hang", "preempted",
...). Everything comes from the run directory's own records (metrics.jsonl, ledger.jsonl,
verdicts/), so a run of any backend draws the same. matplotlib is an optional extra
(`pip install 'dist-jobs[plot]'`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dist_jobs.errors import UsageError
from dist_jobs.rundir.ledger import read_events
from dist_jobs.rundir.progress import read_history
from dist_jobs.rundir.verdict import VERDICTS, Action, Ending, Verdict, recorded

STEPS_PER_S = "steps/s"  # derived from the rows' times, not a logged metric
PANELS = (
    ("loss", ("loss", "eval_loss")),
    ("steps/s", (STEPS_PER_S,)),
    ("accuracy", ("accuracy", "eval_accuracy")),
)


@dataclass(frozen=True)
class Drawn:
    """What a plot shows: the steps of each attempt's points, where runs resumed, which faults."""

    path: Path
    attempts: list[list[int]] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)


def plot_run(run_dir: Path, out: Path, title: str) -> Drawn:
    """Draw the run in `run_dir` into `out` (PNG, or any format matplotlib knows by its suffix)."""
    rows = read_history(run_dir)
    if not rows:
        raise UsageError(f"{run_dir} has no metrics yet (metrics.jsonl)", "plot once the run has logged a step")
    pyplot = _pyplot()
    events = sorted((e for e in read_events(run_dir) if e.get("event") == "start"), key=lambda e: _number(e["time"]))
    attempts = _by_attempt(rows, [_number(e["time"]) for e in events])
    faults = [v for v in _verdicts(run_dir) if v.ending not in (Ending.COMPLETED, Ending.CANCELLED)]
    labels = [v.attempt for v in _verdicts(run_dir)]
    labels += [f"#{i}" for i in range(len(labels), len(attempts))]  # an attempt still running
    figure, axes = pyplot.subplots(len(PANELS), 1, figsize=(9, 8), sharex=True)
    for axis, (label, names) in zip(axes, PANELS, strict=True):
        _panel(axis, label, names, attempts, labels)
    resumed = [int(_number(e.get("resumed_step"))) for e in events[1:]]  # where each later attempt began
    for axis in axes:
        for step in resumed:
            axis.axvline(step, color="grey", linestyle="--", linewidth=0.8)
    for step, label in zip(resumed, labels[1:], strict=False):  # the line says what it is
        where = {"xy": (step, 0.98), "xycoords": ("data", "axes fraction")}
        axes[0].annotate(
            f"attempt {label} ", **where, rotation=90, ha="right", va="top", fontsize="x-small", color="grey"
        )
    ended = [v for v in _verdicts(run_dir) if v.ending is not Ending.COMPLETED]
    _mark_endings(axes[0], ended, attempts)
    axes[0].set_title(title)
    axes[-1].set_xlabel("optimizer step")
    figure.tight_layout()
    figure.savefig(out)
    pyplot.close(figure)
    steps = [[int(_number(r["step"])) for r in a] for a in attempts]
    return Drawn(out, steps, resumed, [f"{v.ending}: {v.cause}" if v.cause else str(v.ending) for v in faults])


def _pyplot() -> Any:
    try:
        # an optional extra, for this verb alone: no other command pays for matplotlib
        import matplotlib

        matplotlib.use("Agg")  # a file, never a window: the login node has no display
        import matplotlib.pyplot as pyplot  # after use("Agg"), as matplotlib asks
    except ImportError:
        raise UsageError(
            "dist-jobs plot needs matplotlib, which is not installed", "pip install 'dist-jobs[plot]'"
        ) from None
    return pyplot


def _by_attempt(rows: Sequence[Mapping[str, object]], starts: Sequence[float]) -> list[list[Mapping[str, object]]]:
    """The rows split where each attempt started (the ledger's `start` events), in time order."""
    bounds = sorted(starts)[1:]
    attempts: list[list[Mapping[str, object]]] = [[] for _ in range(len(bounds) + 1)]
    for row in sorted(rows, key=lambda r: _number(r.get("time"))):
        index = sum(_number(row.get("time")) >= bound for bound in bounds)
        attempts[index].append(row)
    return [a for a in attempts if a]


def _panel(
    axis: Any,
    label: str,
    names: Sequence[str],
    attempts: Sequence[Sequence[Mapping[str, object]]],
    labels: Sequence[str],
) -> None:
    for index, rows in enumerate(attempts):
        for name in names:
            points = _rates(rows) if name == STEPS_PER_S else _points(rows, name)
            if points:
                xs, ys = zip(*points, strict=True)
                style = "--" if name.startswith("eval_") else "-"
                axis.plot(xs, ys, style, color=f"C{index % 10}", marker=".", label=f"{name} (attempt {labels[index]})")
    axis.set_ylabel(label)
    if axis.has_data():
        axis.legend(fontsize="x-small", loc="best")


def _points(rows: Sequence[Mapping[str, object]], name: str) -> list[tuple[float, float]]:
    return [
        (_number(r["step"]), _number(m[name])) for r in rows if isinstance(m := r.get("metrics"), dict) and name in m
    ]


def _rates(rows: Sequence[Mapping[str, object]]) -> list[tuple[float, float]]:
    """Optimizer steps a second between consecutive rows of one attempt."""
    out = []
    for before, after in zip(rows, rows[1:], strict=False):
        steps = _number(after["step"]) - _number(before["step"])
        seconds = _number(after.get("time")) - _number(before.get("time"))
        if steps > 0 and seconds > 0:
            out.append((_number(after["step"]), steps / seconds))
    return out


def _mark_endings(axis: Any, ended: Sequence[Verdict], attempts: Sequence[Sequence[Mapping[str, object]]]) -> None:
    """A cross at the last step of each attempt that did not complete, with its verdict and what
    followed: red for a fault, grey for the scheduler's or a person's doing (a preemption, a cancel)."""
    for verdict, rows in zip(ended, attempts, strict=False):
        last = rows[-1]
        metrics = last.get("metrics")
        value = metrics.get("loss") if isinstance(metrics, dict) else None
        if value is None:
            continue
        color = "grey" if verdict.ending in (Ending.PREEMPTED, Ending.CANCELLED) else "red"
        then = f" ({verdict.action})" if verdict.action not in (Action.NONE, Action.DONE) else ""
        axis.plot([_number(last["step"])], [value], "x", color=color, markersize=10)
        axis.annotate(f"{verdict.ending}{then}", (_number(last["step"]), value), color=color, fontsize="small")


def _verdicts(run_dir: Path) -> list[Verdict]:
    """Every verdict the run directory recorded, of every submission, oldest first."""
    try:
        files = sorted((run_dir / VERDICTS).glob("*.jsonl"))
    except OSError:
        return []
    found = [v for f in files for v in recorded(run_dir, f.stem)]
    return sorted(found, key=lambda v: v.time)


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0
