"""`<run dir>/beats/rank-N.json`: each rank's latest sign of life, so that the rank whose hang
watchdog fires can tell which rank stopped, without a collective (the collective is what hangs).

Every rank's watchdog thread rewrites its own file every few seconds (dist_jobs.train.live): the
last optimizer step the rank completed, what its main thread waits in (a collective's name, ""
when it is in none, None when unknown), the collectives it entered when torch's flight recorder
counts them, and the wall-clock time of the write. The write is atomic but not fsynced: a beat is
worth nothing after a crash, and a fsync every few seconds per rank would load a shared file system.

`stopped()` compares them when a watchdog fires. Every rank of a hung job stops stepping (the
others wait for the stopped one in the next collective), so the last completed step alone rarely
tells; in order:
  1. a rank whose beat is stale: its whole process stopped (SIGSTOP, a frozen node, a dead VM);
  2. a rank that entered fewer collectives than the others (the flight recorder's count);
  3. a rank whose main thread is in no collective while the others wait in one (stuck in its own
     code: a dead file system read, a deadlocked data loader);
  4. a rank whose last completed step is behind the others'.
Beats are written with the writer's clock and read with the reader's: ranks on other nodes need
clocks in step within a fraction of `stale_s` (NTP keeps them within milliseconds). Stdlib only.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dist_jobs.rundir.atomic import write_atomic

BEATS = "beats"


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str = ""
    step: int | None = None  # the last optimizer step this rank completed
    time: float = 0.0  # wall clock (time.time()) of the write
    waiting: str | None = None  # the collective the main thread is in; "" none; None unknown
    collectives: int | None = None  # collectives entered (torch's flight recorder), None without it
    attempt: int = 0
    job: str = ""


def beat_path(folder: Path, rank: int) -> Path:
    return folder / BEATS / f"rank-{rank}.json"


def write_beat(folder: Path, beat: Beat) -> None:
    text = json.dumps(asdict(beat), sort_keys=True) + "\n"
    write_atomic(beat_path(folder, beat.rank), text, mkdir=True, durable=False)


def read_beats(folder: Path, world_size: int, *, job: str = "", attempt: int = 0) -> list[Beat]:
    """The beats of ranks 0..world_size-1 of that job and attempt; a rank without one is left out
    (an earlier run's files, of a larger world or another attempt, too)."""
    found = [read_beat(folder, rank, job=job, attempt=attempt) for rank in range(world_size)]
    return [beat for beat in found if beat is not None]


def read_beat(folder: Path, rank: int, *, job: str = "", attempt: int = 0) -> Beat | None:
    """Rank `rank`'s beat of that job and attempt, or None (none yet, unreadable, another run's)."""
    beat = _read(beat_path(folder, rank))
    if beat is None or beat.rank != rank or (beat.job, beat.attempt) != (job, attempt):
        return None
    return beat


def _read(path: Path) -> Beat | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        step, count, waiting = data.get("step"), data.get("collectives"), data.get("waiting")
        return Beat(
            rank=int(data["rank"]),
            host=str(data.get("host", "")),
            step=None if step is None else int(step),
            time=float(data.get("time", 0.0)),
            waiting=None if waiting is None else str(waiting),
            collectives=None if count is None else int(count),
            attempt=int(data.get("attempt", 0)),
            job=str(data.get("job", "")),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def stopped(beats: Sequence[Beat], now: float, stale_s: float) -> list[Beat]:
    """The ranks that stopped before the others (module doc), or [] when none stands out."""
    frozen = [b for b in beats if now - b.time > stale_s]
    if 0 < len(frozen) < len(beats):
        return frozen
    counts = [b.collectives for b in beats if b.collectives is not None]
    if beats and len(counts) == len(beats) and min(counts) < max(counts):
        return [b for b in beats if b.collectives == min(counts)]
    idle = [b for b in beats if b.waiting == ""]
    if idle and any(b.waiting for b in beats):
        return idle
    steps = [b.step for b in beats if b.step is not None]
    if beats and len(steps) == len(beats) and min(steps) < max(steps):
        return [b for b in beats if b.step == min(steps)]
    return []


def waiting_in(beats: Sequence[Beat], stopped_ranks: Sequence[Beat]) -> str:
    """What most of the ranks that did not stop wait in ("" when none says)."""
    named = Counter(b.waiting for b in beats if b not in stopped_ranks and b.waiting)
    return named.most_common(1)[0][0] if named else ""
