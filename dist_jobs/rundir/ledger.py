"""The goodput ledger of a run: where its wall time went, across attempts, from what it recorded.

Rank 0 of the trainer (dist_jobs.train.live) appends small events to `<run dir>/ledger.jsonl`,
one JSON line each, O_APPEND like metrics.jsonl:

    {"event": "start", "time", "attempt", "job", "resumed_step"}  fit() began (time: when its process started)
    {"event": "first_step", "time", "step"}                       the attempt's first optimizer step is done
    {"event": "save", "time", "step", "blocked_s"}                a checkpoint save, and how long it held the loop

Each event carries the writing holder's lock stamp (dist_jobs.rundir.stamps), as the verdicts do.

The launchers' verdicts (dist_jobs.rundir.verdict) say when and how each attempt ended, and
metrics.jsonl (dist_jobs.rundir.progress) how far each got. `ledger()` puts them together; it
is pure (files in, numbers out), so status computes it on every backend that can read the run
directory, without torch.

Terms, per attempt (start S, its first step done at F, its end E: its verdict's time, or now):
    wall      submission (or the first attempt's start, where the backend cannot say) to the end
              of the last attempt, or now while the job is not over
    queued    wall minus the attempts' lifetimes (E - S): pending, and between attempts
    startup   S to F: the process, imports, rendezvous, model, resume and the first step
    kept step k: the step the next attempt resumed from (the newest save, for an attempt
              still to be resumed; every step reached, for the last one)
    productive F to the time step k was reached (its save, or its metrics row), less saves
    lost      that time to E (steps recomputed after the resume, and the wait for the fault to be
              noticed), less saves; lost_steps: the steps past k the attempt reached, as far as
              its metrics rows say (train.log_every apart)
    save_blocked  the time the loop waited for checkpoint saves
    so wall = queued + startup + productive + lost + save_blocked; goodput = productive / wall.
A fault is an attempt that ended other than completed or cancelled; its cost is its lost time
and the queue and start-up of the attempt after it. Stdlib only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dist_jobs.rundir.holder import process_start
from dist_jobs.rundir.progress import read_history, read_json_lines
from dist_jobs.rundir.stamps import live_rows
from dist_jobs.rundir.verdict import Action, Ending, Verdict, recorded

LEDGER = "ledger.jsonl"
_NOT_FAULTS = (Ending.COMPLETED, Ending.CANCELLED)
_OVER = (Action.DONE, Action.FAIL, Action.STOP, Action.NONE)  # no attempt follows
_AGAIN = (Action.REQUEUE, Action.RESTART)


def note(run_dir: Path, event: str, **fields: object) -> None:
    """Append one event to `<run_dir>/ledger.jsonl` in one write."""
    line = json.dumps({"event": event, **fields}, sort_keys=True, default=str) + "\n"
    with open(run_dir / LEDGER, "a", encoding="utf-8") as fh:  # O_APPEND: a line lands whole
        fh.write(line)


def process_started(now: float | None = None) -> float:
    """When this process started (unix time, to about 10 ms), from /proc; `now` where there is no /proc."""
    now = time.time() if now is None else now
    ticks = process_start(os.getpid())
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now if ticks is None else now - (uptime - ticks / per_s)


def read_events(run_dir: Path) -> list[dict[str, object]]:
    """Every complete event, oldest first; torn or foreign lines are skipped, and so are the late
    ones: an event of a holder superseded before it landed (dist_jobs.rundir.stamps)."""
    return live_rows(read_json_lines(run_dir / LEDGER, "time", (int, float)))[0]


def is_fault(ending: Ending) -> bool:
    """Whether an attempt that ended so is a fault, whose cost the ledger charges: every ending
    but a completion and a cancel (a preemption costs the run its requeue too)."""
    return ending not in _NOT_FAULTS


@dataclass(frozen=True)
class Attempt:
    """One attempt's share of the wall time; `start`/`first_step`/`end` are unix times."""

    attempt: str
    start: float
    first_step: float | None
    end: float
    resumed_from: int
    step_to: int  # the last step it reached (as far as its records say)
    kept_step: int
    lost_steps: int
    startup_s: float
    productive_s: float
    lost_s: float
    save_blocked_s: float
    ending: str = ""  # its verdict; "" while it runs
    action: str = ""
    cause: str = ""
    node: str = ""
    rank: int | None = None
    cost_s: float = 0.0  # a fault's: its lost time, and the queue and start-up of the attempt after it

    @property
    def fault(self) -> bool:
        return bool(self.ending) and is_fault(Ending(self.ending))


@dataclass(frozen=True)
class Ledger:
    wall_s: float
    queued_s: float
    startup_s: float
    productive_s: float
    lost_s: float
    lost_steps: int
    save_blocked_s: float
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def faults(self) -> int:
        return sum(a.fault for a in self.attempts)

    @property
    def fault_cost_s(self) -> float:
        return sum(a.cost_s for a in self.attempts if a.fault)

    def told(self) -> str:
        """`goodput 91% (2 faults, 3m10s lost)`: lost is what the faults cost."""
        faults = self.faults
        said = (
            f"{faults} fault{'s' if faults != 1 else ''}, {_duration(self.fault_cost_s)} lost" if faults else "no fault"
        )
        return f"goodput {100 * self.goodput:.0f}% ({said})"

    def summary(self) -> dict[str, object]:
        """`-o json`'s `goodput`: the run's totals, seconds rounded to ms."""
        numbers = {k: round(v, 3) for k, v in asdict(self).items() if isinstance(v, float)}
        return {
            "percent": round(100 * self.goodput, 1),
            **numbers,
            "lost_steps": self.lost_steps,
            "faults": self.faults,
            "fault_cost_s": round(self.fault_cost_s, 3),
        }

    def attempt_dicts(self) -> list[dict[str, object]]:
        return [{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(a).items()} for a in self.attempts]


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


@dataclass(frozen=True)
class _Span:
    """One attempt's bounds: its start event (None: none recorded), start, end, verdict."""

    started: Mapping[str, object] | None
    start: float
    end: float
    verdict: Verdict | None


def ledger(run_dir: Path, submission: str, submitted_at: float | None, now: float) -> Ledger | None:
    """The ledger of submission `submission` of the run in `run_dir` (None when its trainer
    recorded no start: a program of its own, or not started yet). `submitted_at`: when the
    scheduler took the job (None: the first attempt's start); `now`: the end of a job not over."""
    verdicts = sorted(recorded(run_dir, submission), key=lambda v: v.time)
    return account(read_events(run_dir), verdicts, read_history(run_dir), submitted_at, now)


def account(
    events: Sequence[Mapping[str, object]],
    verdicts: Sequence[Verdict],
    rows: Sequence[Mapping[str, object]],
    submitted_at: float | None,
    now: float,
) -> Ledger | None:
    """`ledger()` on the records themselves: events, verdicts oldest first, metrics rows."""
    since = float("-inf") if submitted_at is None else submitted_at
    events = [e for e in events if _time(e) >= since]
    starts = [e for e in events if e.get("event") == "start"]
    if not starts:
        return None
    begin = _time(starts[0]) if submitted_at is None else submitted_at
    spans = _spans(starts, verdicts, begin, now)
    attempts = []
    for i, span in enumerate(spans):
        after = spans[i + 1].started if i + 1 < len(spans) else None
        attempts.append(_attempt(span, None if after is None else _int(after.get("resumed_step")), events, rows))
    attempts = _costed(attempts)
    last = spans[-1]
    end = last.end if last.verdict is not None and last.verdict.action in _OVER else now
    wall = max(end - begin, 0.0)
    return Ledger(
        wall_s=wall,
        queued_s=max(wall - sum(a.end - a.start for a in attempts), 0.0),
        startup_s=sum(a.startup_s for a in attempts),
        productive_s=sum(a.productive_s for a in attempts),
        lost_s=sum(a.lost_s for a in attempts),
        lost_steps=sum(a.lost_steps for a in attempts),
        save_blocked_s=sum(a.save_blocked_s for a in attempts),
        attempts=attempts,
    )


def _spans(starts: list[Mapping[str, object]], verdicts: Sequence[Verdict], begin: float, now: float) -> list[_Span]:
    """Each verdict closes the attempt whose (first) start came after the verdict before it;
    a start after the last verdict is the attempt running now."""
    spans, previous = [], begin
    for verdict in verdicts:
        inside = [s for s in starts if previous <= _time(s) <= verdict.time]
        first = inside[0] if inside else None
        spans.append(_Span(first, previous if first is None else _time(first), verdict.time, verdict))
        previous = verdict.time
    running = [s for s in starts if _time(s) > previous]
    if running:
        spans.append(_Span(running[0], _time(running[0]), max(now, _time(running[0])), None))
    return spans


def _attempt(
    span: _Span,
    resumed_next: int | None,
    events: Sequence[Mapping[str, object]],
    rows: Sequence[Mapping[str, object]],
) -> Attempt:
    inside = [e for e in events if span.start <= _time(e) <= span.end]
    first = next((e for e in inside if e.get("event") == "first_step"), None)
    saves = [e for e in inside if e.get("event") == "save"]
    steps = [*saves, *([first] if first else []), *(r for r in rows if span.start <= _time(r) <= span.end)]
    resumed = _int(span.started.get("resumed_step")) if span.started is not None else 0
    reached = max([resumed, *(_int(s.get("step")) for s in steps)])
    again = resumed_next is not None or (span.verdict is not None and span.verdict.action in _AGAIN)
    kept = reached
    if resumed_next is not None:
        kept = resumed_next
    elif again:  # to be resumed: from its newest save
        kept = max((_int(s.get("step")) for s in saves), default=resumed)
    kept = min(max(kept, resumed), reached)
    kept_at = _time_of(kept, steps, _time(first) if first else span.start) if again else None
    startup, productive, lost, waited = _split(span, first, saves, kept_at)
    v = span.verdict
    return Attempt(
        attempt=v.attempt if v is not None and v.attempt else str((span.started or {}).get("attempt", "")),
        start=span.start,
        first_step=None if first is None else _time(first),
        end=span.end,
        resumed_from=resumed,
        step_to=reached,
        kept_step=kept,
        lost_steps=reached - kept,
        startup_s=startup,
        productive_s=productive,
        lost_s=lost,
        save_blocked_s=waited,
        ending="" if v is None else v.ending.value,
        action="" if v is None else v.action.value,
        cause="" if v is None else v.cause,
        node="" if v is None else v.node,
        rank=None if v is None else v.rank,
    )


def _split(
    span: _Span, first: Mapping[str, object] | None, saves: Sequence[Mapping[str, object]], kept_at: float | None
) -> tuple[float, float, float, float]:
    """(startup, productive, lost, blocked in saves) of an attempt whose kept steps end at
    `kept_at` (None: all it did is kept)."""
    if first is None:  # it never stepped: all of it was start-up
        return span.end - span.start, 0.0, 0.0, 0.0
    stepped = _time(first)
    kept_at = span.end if kept_at is None else min(max(kept_at, stepped), span.end)
    blocked = [(_time(s), _number(s.get("blocked_s"))) for s in saves]
    waited = sum(b for _, b in blocked)
    before = sum(b for t, b in blocked if t <= kept_at)
    productive = max(kept_at - stepped - before, 0.0)
    lost = max(span.end - kept_at - (waited - before), 0.0)
    return stepped - span.start, productive, lost, waited


def _time_of(step: int, points: Sequence[Mapping[str, object]], default: float) -> float:
    """When `step` was reached: its save (the latest such record), else the latest record of a
    step before it; `default` when none says."""
    exact = [_time(p) for p in points if _int(p.get("step")) == step]
    if exact:
        return max(exact)
    earlier = [_time(p) for p in points if _int(p.get("step")) < step]
    return max(earlier, default=default)


def _costed(attempts: list[Attempt]) -> list[Attempt]:
    """Each fault's cost: its lost time, then the queue and start-up until the next attempt stepped."""
    out = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        again = 0.0 if nxt is None else (nxt.start - a.end) + nxt.startup_s
        out.append(replace(a, cost_s=a.lost_s + max(again, 0.0)) if a.fault else a)
    return out


def _time(record: Mapping[str, object]) -> float:
    return _number(record.get("time"))


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
