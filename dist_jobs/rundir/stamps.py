"""Which holder's records a reader believes: the stamps on the run directory's records.

A holder of the run directory's lock that was only paused (SIGSTOP, a suspended SLURM job, an NFS
stall) can wake after another run took the lock over; `Fence.check()` before each write stops most
of its writes, but one that passed its fence and then stalled still lands, late. So every record a
holder writes (progress.json, each metrics.jsonl row, result.json, the PREEMPTED marker, the HANG
record, each ledger event and each verdict) carries `"stamp"`: the holder's `Fence.stamp`
(`stamp_of(token)`, 12 hex digits), or "" for a run that holds no lock (a plain
`python -m dist_jobs.train`): nothing of it is filtered, as nothing of older versions (no stamp)
is. The rules, without an epoch counter or a clock:

- metrics.jsonl, appended: a stamp is retired once a row of another non-empty stamp follows it,
  or the takeover row a successor appends the moment it takes the lock over (dist_jobs.rundir.lock)
  names it; a later row of a retired stamp is a late write, and `live_rows()` drops it. The takeover
  row retires the predecessor before the successor has logged anything (or if it never does), so
  only a row already in flight while the lock itself changed hands can still land unretired.
  ledger.jsonl's events and each submission's verdicts (verdicts/<submission>.jsonl), appended
  too, follow the same rule (without takeover rows of their own).
- progress.json and result.json, replaced: `believed()` refuses one whose stamp is retired in
  metrics.jsonl, or is not the stamp of the holder LOCK names while it names one.
- PREEMPTED and HANG, one per attempt: `this_attempts()` takes one for the reader's attempt only
  when its stamp is the stamp of the lock that attempt holds, where both are known, and it is not
  older than the attempt's start (a restart in place keeps its lock, so its stamp).
Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from dist_jobs.rundir.history import TOOK_OVER
from dist_jobs.rundir.lock import LOCK_NAME, current, stamp_of

__all__ = ["STAMP", "believed", "holder_stamp", "live_rows", "stamp_in", "stamp_of", "this_attempts"]

STAMP = "stamp"  # the field every record carries
_Row = TypeVar("_Row", bound=Mapping[str, object])


def stamp_in(record: Mapping[str, object]) -> str:
    """The stamp a record carries; "" for none (an older version's, or a run without a lock)."""
    found = record.get(STAMP)
    return found if isinstance(found, str) else ""


def live_rows(rows: Iterable[_Row]) -> tuple[list[_Row], set[str]]:
    """The rows of an append-only log without the late ones and the takeover rows, and the stamps
    retired in it."""
    kept: list[_Row] = []
    retired: set[str] = set()
    last = ""  # the newest non-empty stamp so far
    for row in rows:
        stamp = stamp_in(row)
        if stamp and stamp in retired:
            continue  # its holder was superseded before this row landed
        if stamp and stamp != last:
            if last:
                retired.add(last)
            last = stamp
        if TOOK_OVER in row:  # a successor's first word: the holder it took the lock from is done
            predecessor = row[TOOK_OVER]
            if isinstance(predecessor, str) and predecessor and predecessor != stamp:
                retired.add(predecessor)
            continue
        kept.append(row)
    return kept, retired


def holder_stamp(run_dir: Path) -> str | None:
    """The stamp of the holder LOCK names now; None while it names none (released, unreadable)."""
    holder = current(run_dir / LOCK_NAME)
    return None if holder is None else stamp_of(holder.token)


def believed(stamp: str, retired: set[str], holder: str | None) -> bool:
    """Whether a replaced record of `stamp` is the run's: not of a retired holder, and of the holder
    LOCK names (`holder`, its stamp), while it names one. A record without a stamp always is."""
    if not stamp:
        return True
    return stamp not in retired and (holder is None or stamp == holder)


def this_attempts(stamp: str, mine: str, written: float, since: float | None) -> bool:
    """Whether a marker or record (PREEMPTED, HANG) of `stamp`, written at `written`, is the
    attempt's whose lock has stamp `mine` and that started at `since` (None: whenever). Another
    holder's never is; without a stamp on either side, only its time says (`written >= since`)."""
    if stamp and mine and stamp != mine:
        return False
    return since is None or written >= since
