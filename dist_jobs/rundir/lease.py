"""Keeping the run directory lock (dist_jobs.rundir.lock): the heartbeat that renews its lease.

The holder touches LOCK every heartbeat from a daemon thread, so a newcomer watching the file
sees it beat and refuses to start a second run. Each beat is Lock.beat(): a transient I/O error
is retried within the lease, and a beat that fails past it, or a heartbeat that fails in any
other way, is a lost lease: `on_lost` runs once and the holder must write nothing more. A lock
joined from the launcher (not owned) is only watched: its launcher beats it.

`held()` is the whole tenancy for a block: the lock taken (or joined), kept beating, released.
Shell scripts keep it with `python3 -m dist_jobs.rundir.lockctl heartbeat`, a process of its own.
Stdlib only, like the lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import Lock, acquire

__all__ = ["Heartbeat", "held"]


class Heartbeat:
    """Touches a lock every `every` seconds (default: the period its holder record states) from a daemon thread;
    `on_lost` runs once if the lock stops being ours (another run took it over: we looked dead).
    A joined lock (not owned) is only watched: its launcher beats it."""

    def __init__(
        self, lock: Lock, every: float | None = None, on_lost: Callable[[Holder | None], None] | None = None
    ) -> None:
        self.lock = lock
        self.every = lock.holder.every if every is None else every
        self.on_lost = on_lost
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dist-jobs-lock-heartbeat", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every):
                if not self.lock.beat(touch=self.lock.owned):
                    break
            else:
                return
        except Exception as exc:  # whatever ends the heartbeat ends the lease: nobody beats it any more
            self.lock.successor, self.lock.failure = None, f"the heartbeat failed: {exc!r}"
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost(self.lock.successor)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)


@contextlib.contextmanager
def held(
    run_dir: Path,
    me: Holder,
    inherited: str = "",
    on_lost: Callable[[Holder | None], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[Lock]:
    """The lock for the duration of the block: taken (or joined), kept beating, released."""
    lock = acquire(run_dir, me, inherited, on_wait=on_wait)
    try:
        with Heartbeat(lock, on_lost=on_lost):
            yield lock
    finally:
        lock.release()
