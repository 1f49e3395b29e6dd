"""How a newcomer judges a run directory lock that may be dead, and takes it over
(dist_jobs.rundir.lock has the protocol): what it watched of the holder on its own clock, and
the break, which puts the newcomer's record in place of the stale one without a moment when
LOCK is missing. Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from dist_jobs.rundir.atomic import write_new
from dist_jobs.rundir.holder import Holder

ASK_SCHEDULER_EVERY = 10.0  # seconds between two squeue calls about the same holder while waiting
BREAK_ABANDONED_S = 10.0  # a breaker holds its guard for a few file operations: seen longer, it died


@dataclass(frozen=True)
class Seen:
    """One look at the lock file: its bytes, its holder (None: unreadable) and its mtime, compared
    only with the mtime of another look (a beat changes it), never with a clock."""

    raw: bytes
    holder: Holder | None
    mtime: float


def look(path: Path) -> Seen | None:
    try:
        raw = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return Seen(raw, Holder.parse(raw), mtime)


def break_stale(path: Path, judged: Seen, record: bytes, guards: dict[str, float]) -> bool | None:
    """Put our `record` in place of the stale lock we judged: True once LOCK is ours, False when
    LOCK changed meanwhile (look again), None while another newcomer is breaking it (wait).
    LOCK is never missing on the way (a newcomer that saw no file would create its own beside
    ours, and the fence of a holder would read "lost"): ours is renamed over it. One newcomer
    breaks a given record at a time, under an exclusive guard file it alone removes."""
    guard = claim_guard(path, judged, guards)
    if guard is None:
        return None
    try:
        return replace_judged(path, judged, record)
    finally:
        guard.unlink(missing_ok=True)  # ours: another's guard is never removed


def claim_guard(path: Path, judged: Seen, guards: dict[str, float]) -> Path | None:
    """Our exclusive guard for breaking `judged`, or None while another newcomer holds one.
    Guards are numbered per judged record: a breaker that died holding guard N (its record
    unchanged for BREAK_ABANDONED_S on our own clock, `guards` remembers since when) is
    passed by taking guard N+1, and its file is left alone, as is any guard of another record."""
    prefix = f".{path.name}.breaking.{hashlib.sha256(judged.raw).hexdigest()[:24]}."
    taken = [int(p.name[len(prefix) :]) for p in path.parent.glob(f"{prefix}*") if p.name[len(prefix) :].isdigit()]
    if taken:
        last = f"{prefix}{max(taken)}"
        if time.monotonic() - guards.setdefault(last, time.monotonic()) < BREAK_ABANDONED_S:
            return None  # another newcomer is breaking it: look again
    guard = path.with_name(f"{prefix}{max(taken) + 1 if taken else 0}")
    return guard if write_new(guard, uuid.uuid4().hex) else None


def replace_judged(path: Path, judged: Seen, record: bytes) -> bool:
    """Rename our record over LOCK if LOCK is still the file we judged. A hard link aside pins
    that file while we compare it: the very inode that is LOCK right before the rename."""
    mine = path.with_name(f".{path.name}.new.{uuid.uuid4().hex}")
    aside = path.with_name(f".{path.name}.judged.{uuid.uuid4().hex}")
    mine.write_bytes(record)
    try:
        try:
            os.link(path, aside)
        except FileNotFoundError:
            return False  # released: the caller creates it afresh
        now = aside.stat()
        if aside.read_bytes() != judged.raw or now.st_mtime != judged.mtime:
            return False  # it beat, or it is another holder's already
        if os.stat(path).st_ino != now.st_ino:
            return False  # replaced between our link and now
        os.rename(mine, path)
        return True
    except FileNotFoundError:
        return False  # released while we compared
    finally:
        mine.unlink(missing_ok=True)
        aside.unlink(missing_ok=True)


def takeover_reason(holder: Holder | None, held_for: float, stale_after: float) -> str | None:
    """Why a newcomer may take the lock from `holder` now, or None when `holder` may be alive:
    `held_for` is how long we have watched it without seeing a beat, by our own clock. The limit
    is at least three of its own heartbeat periods, whatever our knob says. A verdict that
    spares the wait (same job, scheduler) is the caller's, once the holder was seen not to beat."""
    if holder is not None and holder.gone():
        return f"its holder ({holder.describe()}) is not running any more"
    limit = max(stale_after, 3 * holder.every) if holder is not None else stale_after
    if held_for >= limit:
        return f"its holder's heartbeat was not seen for {held_for:.0f} s (stale after {limit:.0f} s)"
    return None


class Watch:
    """What a newcomer has seen of one holder while deciding whether it is alive, on its own clock."""

    def __init__(self, seen: Seen) -> None:
        self.first = seen
        self.last = seen
        self.since = time.monotonic()  # when we last saw it beat (or first looked)
        self.beats = 0  # beats seen
        self.asked: float | None = None  # when squeue was last asked about its job
        self.told = False  # the waiting message was given
        self.guards: dict[str, float] = {}  # another breaker's guard file -> when we first saw it

    def same_holder(self, seen: Seen) -> bool:
        return seen.raw == self.first.raw

    def saw(self, seen: Seen, now: float) -> None:
        if seen.mtime != self.last.mtime:
            self.beats, self.since = self.beats + 1, now
        self.last = seen

    def quiet(self, now: float) -> float:
        """Seconds since we last saw it beat (or first looked), by our own clock."""
        return now - self.since

    def verdict_without_beat(self, holder: Holder | None, me: Holder, now: float) -> str | None:
        """The same job's or the scheduler's word that the holder is over; heard only once no beat
        was seen for two of its heartbeat periods: an old attempt whose processes live on after
        its node dropped out of SLURM still beats, and its run still writes."""
        if holder is None or self.quiet(now) < 2 * holder.every:
            return None
        if holder.owner and holder.owner == me.owner:
            return f"an earlier attempt of the same job ({holder.owner}) held it and stopped beating"
        if self.asked is not None and now - self.asked < ASK_SCHEDULER_EVERY:
            return None
        self.asked = now
        state = holder.job_ended()
        return None if state is None else f"its holder's SLURM job {holder.job_id} is {state.lower()} (squeue)"
