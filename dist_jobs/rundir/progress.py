"""`<run dir>/progress.json` and `<run dir>/metrics.jsonl`: a run's live progress and its history.

Rank 0 of the trainer writes both at every log interval (dist_jobs.train.loop); `dist-jobs status`,
`Job.progress()` and the sweep's status table read them. progress.json is replaced atomically
(dist_jobs.rundir.atomic), so a reader sees the old file or the new one, never half of
one; metrics.jsonl gets one JSON line per interval, appended and flushed, and a reader skips a
torn last line (a writer killed mid-line). Readers never raise on what they find in the file.

progress.json: step (optimizer steps done), total_steps (int or null), epoch, metrics
({name: float}), samples_per_s, eta_s (float or null), checkpoint_step (the last committed
checkpoint, or null), attempt, owner (the job that writes it: `slurm:ID`, `k8s:KIND/NS/NAME`, or ""
for a local run; absent in files of older versions), time (unix seconds), state ("running" |
"finished"), stamp (the writing holder's lock stamp, dist_jobs.rundir.stamps; "" without a lock,
absent in files of older versions).
metrics.jsonl rows: {"step", "epoch", "time", "metrics", "stamp", "owner"} (no stamp or owner in
older versions' rows), and the takeover row a holder appends when it takes the lock over
(dist_jobs.rundir.history), which readers never show.

A holder that lost the lock while stalled in a write can land that write late; its stamp tells it
apart (dist_jobs.rundir.stamps): `read_history()` drops the late rows of a superseded holder, and
`read_progress()` refuses a progress.json of a superseded holder, or of another holder than the
one LOCK names, and shows the newest holder's last metrics row instead (step, epoch, time and the
latest of each metric it logged; no total, ETA or state), or nothing when it logged none.
Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.history import HISTORY, TOOK_OVER, read_objects
from dist_jobs.rundir.stamps import believed, holder_stamp, live_rows, stamp_in

PROGRESS = "progress.json"


def write_progress(run_dir: Path, progress: Mapping[str, object]) -> None:
    """Replace `<run_dir>/progress.json` atomically."""
    text = json.dumps(dict(progress), sort_keys=True, allow_nan=False, default=str) + "\n"
    write_atomic(run_dir / PROGRESS, text, mkdir=True)


def read_progress(run_dir: Path) -> dict[str, object] | None:
    """The run's progress, or None when there is none yet or the file is not a progress record.
    A superseded holder's record is not the run's: then the newest holder's last metrics row."""
    try:
        data = json.loads((run_dir / PROGRESS).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, unreadable, half-written by a foreign writer, not JSON
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        return None
    if not superseded(run_dir, stamp_in(data)):
        return data
    return _from_rows(read_history(run_dir), holder_stamp(run_dir))  # rare: a late write was there


def superseded(run_dir: Path, stamp: str) -> bool:
    """Whether a record of `stamp` that replaces a file of `run_dir` (progress.json, result.json)
    is a superseded holder's late write, not the run's (dist_jobs.rundir.stamps.believed). No
    stamp (a run without a lock, an older version) is never superseded."""
    if not stamp:
        return False
    holder = holder_stamp(run_dir)
    if holder == stamp:  # the live holder's own: no holder after it can have retired it
        return False
    return not believed(stamp, _history(run_dir)[1], holder)


def _from_rows(rows: list[dict[str, object]], holder: str | None) -> dict[str, object] | None:
    """What the newest holder (the one LOCK names, else the last to log) last logged, as progress."""
    newest = holder if holder is not None else next((stamp_in(r) for r in reversed(rows) if stamp_in(r)), "")
    mine = [r for r in rows if newest and stamp_in(r) == newest]
    if not mine:
        return None
    metrics: dict[str, object] = {}
    for row in mine:  # the latest of each metric, as the writer keeps them in progress.json
        logged = row.get("metrics")
        if isinstance(logged, dict):
            metrics.update(logged)
    last = mine[-1]
    found: dict[str, object] = {k: last[k] for k in ("step", "epoch", "time", "owner") if k in last}
    return {**found, "metrics": metrics, "stamp": newest}


def owned_by(progress: Mapping[str, object], owner: str | None) -> bool:
    """Whether job `owner` wrote `progress`. Jobs may share a run directory (one refused while
    another holds it, a dead one before a live one): each sees only its own counter. A file
    without an owner (an older trainer's, a local run's) or a job of unknown owner: as before."""
    written = progress.get("owner")
    return not written or not owner or written == owner


def read_history(run_dir: Path) -> list[dict[str, object]]:
    """Every complete row of metrics.jsonl, oldest first; torn or garbage lines are skipped, and so
    are the late rows of a superseded holder (dist_jobs.rundir.stamps.live_rows)."""
    return _history(run_dir)[0]


def _history(run_dir: Path) -> tuple[list[dict[str, object]], set[str]]:
    """read_history() and the stamps retired in metrics.jsonl."""
    rows = [r for r in read_objects(run_dir / HISTORY) if isinstance(r.get("step"), int) or TOOK_OVER in r]
    return live_rows(rows)


def read_json_lines(path: Path, key: str, kind: type | tuple[type, ...]) -> list[dict[str, object]]:
    """The records of a JSON-lines file (metrics.jsonl, ledger.jsonl), oldest first, that have
    `key` of type `kind` (dist_jobs.rundir.history.read_objects)."""
    return [record for record in read_objects(path) if isinstance(record.get(key), kind)]


def _number(value: object, fmt: str) -> str | None:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def describe(progress: Mapping[str, object]) -> str:
    """One line: `step 40/100 (40%) epoch 1  loss 0.41 lr 0.1  12.3 samples/s  eta 2m05s  checkpoint 30  attempt 0`."""
    step, total = progress.get("step"), progress.get("total_steps")
    parts = [f"step {step}/{total}" if isinstance(total, int) and total else f"step {step}"]
    if isinstance(step, int) and isinstance(total, int) and total:
        parts[0] += f" ({100 * step // total}%)"
    parts[0] += f" epoch {progress.get('epoch')}"
    metrics = progress.get("metrics")
    if isinstance(metrics, Mapping) and metrics:
        shown = [f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))]
        parts.append(" ".join(shown))
    rate = _number(progress.get("samples_per_s"), ".4g")
    if rate is not None:
        parts.append(f"{rate} samples/s")
    eta = progress.get("eta_s")
    if isinstance(eta, (int, float)) and progress.get("state") != "finished":
        parts.append(f"eta {duration(float(eta))}")
    checkpoint = progress.get("checkpoint_step")
    parts.append(f"checkpoint {checkpoint if isinstance(checkpoint, int) else '-'}")
    parts.append(f"attempt {progress.get('attempt', 0)}")
    if progress.get("state") == "finished":
        parts.append("finished")
    quiet = progress.get("quiet_s")
    if isinstance(quiet, (int, float)):
        parts.append(f"no progress for {duration(float(quiet))}")
    return "  ".join(parts)


def quiet_for(progress: Mapping[str, object], now: float) -> float | None:
    """Seconds since a running record was written, when that is over 3 of its own intervals
    (`every_s`, the time between its last two writes) and over 30 s: no rank is
    stepping (a dead node, a hang, a long save). None while it keeps its pace."""
    written, every = progress.get("time"), progress.get("every_s")
    if progress.get("state") != "running" or not isinstance(written, (int, float)):
        return None
    age = now - float(written)
    pace = float(every) if isinstance(every, (int, float)) else 0.0
    return age if age > max(30.0, 3 * pace) else None
