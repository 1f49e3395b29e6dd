"""`dist-jobs plot HANDLE -o run.png`: a run as a picture, every attempt of it.

Three panels over the optimizer step: train and eval loss, throughput (optimizer steps a second,
from the times rank 0 logged them), train and eval accuracy; each attempt in its own colour
(as the goodput ledger bounds them), a dashed line where an attempt resumed from a checkpoint, and
a cross with the verdict where an attempt did not complete: red for a fault as the ledger counts it
("rank killed", "hang", "preempted", ...), grey for a cancel. Everything comes from the run
directory's own records (metrics.jsonl, ledger.jsonl, verdicts/), so a run of any backend draws
the same. matplotlib is an optional extra
(`pip install 'dist-jobs[plot]'`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dist_jobs.errors import UsageError
from dist_jobs.rundir.ledger import account, is_fault, read_events
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
    """What a plot shows: the steps of each attempt's points and its label, where runs resumed,
    which faults, and the endings marked on the curve."""

    path: Path
    attempts: list[list[int]] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)  # "rank killed (restart) at step 80"


@dataclass(frozen=True)
class _Attempt:
    """One attempt as the goodput ledger bounds it, with the rows it logged."""

    label: str
    resumed_step: int
    rows: list[Mapping[str, object]]
    ending: str = ""  # its verdict's ending, "" while it runs
    action: str = ""


def plot_run(run_dir: Path, out: Path, title: str) -> Drawn:
    """Draw the run in `run_dir` into `out` (PNG, or any format matplotlib knows by its suffix)."""
    rows = read_history(run_dir)
    if not rows:
        raise UsageError(f"{run_dir} has no metrics yet (metrics.jsonl)", "plot once the run has logged a step")
    pyplot = _pyplot()
    verdicts = _verdicts(run_dir)
    drawn = [a for a in _attempts(run_dir, rows, verdicts) if a.rows]  # a start that logged nothing has no point
    figure, axes = pyplot.subplots(len(PANELS), 1, figsize=(9, 8), sharex=True)
    for axis, (label, names) in zip(axes, PANELS, strict=True):
        _panel(axis, label, names, drawn)
    for attempt in drawn[1:]:  # where each later attempt resumed, and which it is
        for axis in axes:
            axis.axvline(attempt.resumed_step, color="grey", linestyle="--", linewidth=0.8)
        where = {"xy": (attempt.resumed_step, 0.98), "xycoords": ("data", "axes fraction")}
        axes[0].annotate(
            f"{attempt.label} ", **where, rotation=90, ha="right", va="top", fontsize="x-small", color="grey"
        )
    marked = _mark_endings(axes[0], drawn)
    axes[0].set_title(title)
    axes[-1].set_xlabel("optimizer step")
    figure.tight_layout()
    figure.savefig(out)
    pyplot.close(figure)
    faults = [v for v in verdicts if is_fault(v.ending)]
    return Drawn(
        out,
        [[int(_number(r["step"])) for r in a.rows] for a in drawn],
        [a.resumed_step for a in drawn[1:]],
        [f"{v.ending}: {v.cause}" if v.cause else str(v.ending) for v in faults],
        [a.label for a in drawn],
        marked,
    )


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


def _attempts(run_dir: Path, rows: Sequence[Mapping[str, object]], verdicts: Sequence[Verdict]) -> list[_Attempt]:
    """The run's attempts as its goodput ledger bounds them (dist_jobs.rundir.ledger, the one
    owner of which start, rows and verdict make an attempt), each with the rows it logged.
    Labelled "attempt 0", "attempt 0.1", ..., or numbered "#1", "#2", ... where the labels
    repeat (each `dist-jobs run` of a local run is a submission of its own, attempt 0)."""
    book = account(read_events(run_dir), verdicts, rows, None, time.time())
    if book is None:  # no ledger (a program of its own, an older run): one attempt
        return [_Attempt("", 0, list(rows))]
    found = [
        _Attempt(
            a.attempt,
            a.resumed_from,
            [r for r in rows if a.start <= _number(r.get("time")) <= a.end],
            a.ending,
            a.action,
        )
        for a in book.attempts
    ]
    labels = [a.label for a in found]
    if len(set(labels)) < len(labels) or "" in labels:
        return [replace(a, label=f"#{i}") for i, a in enumerate(found, start=1)]
    return [replace(a, label=f"attempt {a.label}") for a in found]


def _panel(axis: Any, label: str, names: Sequence[str], attempts: Sequence[_Attempt]) -> None:
    for index, attempt in enumerate(attempts):
        for name in names:
            points = _rates(attempt.rows) if name == STEPS_PER_S else _points(attempt.rows, name)
            if points:
                xs, ys = zip(*points, strict=True)
                style = "--" if name.startswith("eval_") else "-"
                axis.plot(xs, ys, style, color=f"C{index % 10}", marker=".", label=f"{name} ({attempt.label})")
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


def _mark_endings(axis: Any, attempts: Sequence[_Attempt]) -> list[str]:
    """A cross at the last step of each attempt that did not complete, with its verdict and what
    followed: red for a fault as the ledger counts it (a preemption too), grey for a cancel."""
    marked = []
    for attempt in attempts:
        last = attempt.rows[-1]
        metrics = last.get("metrics")
        value = metrics.get("loss") if isinstance(metrics, dict) else None
        if attempt.ending in ("", Ending.COMPLETED.value) or value is None:
            continue
        color = "red" if is_fault(Ending(attempt.ending)) else "grey"
        then = f" ({attempt.action})" if attempt.action not in (Action.NONE.value, Action.DONE.value) else ""
        axis.plot([_number(last["step"])], [value], "x", color=color, markersize=10)
        axis.annotate(f"{attempt.ending}{then}", (_number(last["step"]), value), color=color, fontsize="small")
        marked.append(f"{attempt.ending}{then} at step {int(_number(last['step']))}")
    return marked


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
