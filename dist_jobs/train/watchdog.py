"""The hang watchdog: a rank that completes no optimizer step for too long dumps its stacks and exits
with the retryable code, so the scheduler requeues the job and it resumes from its last checkpoint.

Every rank runs one. The hot loop only calls `beat()` after each optimizer step (a clock read and
a deque append: no collective, no lock, no syscall beyond the clock); a daemon thread wakes every
second or so and compares the time since the last beat with
    limit = max(factor x median of the recent step times, floor_s).
A stalled rank and the peers waiting for it in a collective all stop stepping, so all of them
fire. Firing writes every thread's Python stack to stderr (the rank's log) with faulthandler,
which works from this thread while the main thread is stuck, then leaves the marker the batch
script and the pod entrypoint turn into the requeue code (torchrun does not pass exit codes on),
and ends the process with os._exit(REQUEUE_EXIT_CODE): the main thread may be inside a C
collective that never returns to Python, so raising or sys.exit() there would never happen.

Before the first step (start-up, resuming, compiling) nothing is watched: the rendezvous and
collective timeouts cover those. Evaluation and checkpoint saves `touch()` it, so the clock
restarts from them without their time counting as a step.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from dist_jobs.constants import REQUEUE_EXIT_CODE

# Step times the median is taken over: recent enough to follow a change of pace.
WINDOW = 200


class Watchdog:
    """Use as a context manager around the training; `beat()` after every optimizer step."""

    def __init__(
        self,
        factor: float,
        floor_s: float,
        *,
        rank: int = 0,
        on_fire: Callable[[], None] | None = None,
        stream: TextIO | None = None,
        exit: Callable[[int], object] = os._exit,
        check_every_s: float | None = None,
        linger_s: float | None = None,
    ) -> None:
        self.factor, self.floor_s, self.rank = factor, floor_s, rank
        self._on_fire = on_fire
        self._stream = stream
        self._exit = exit
        self._check_every = check_every_s if check_every_s is not None else min(1.0, max(floor_s / 10, 0.01))
        # After its dump, a firing rank waits this long before exiting: its peers, stalled in the
        # same collective since the same step, fire within one check and dump their stacks too
        # before the launcher (srun --kill-on-bad-exit, torchrun) kills them for this exit.
        self._linger = linger_s if linger_s is not None else 3 * self._check_every
        self._times: deque[float] = deque(maxlen=WINDOW)
        self._last: float | None = None  # None: not armed (no step completed yet)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    def beat(self) -> None:
        """One optimizer step completed on this rank."""
        now = time.monotonic()
        last = self._last
        if last is not None:
            self._times.append(now - last)
        self._last = now

    def touch(self) -> None:
        """Work other than a step (evaluation, a checkpoint) made progress: restart the clock."""
        if self._last is not None:
            self._last = time.monotonic()

    def limit(self) -> float:
        steps = list(self._times)
        median = statistics.median(steps) if steps else 0.0
        return max(self.factor * median, self.floor_s)

    def __enter__(self) -> Watchdog:
        self._thread = threading.Thread(target=self._watch, name=f"dist-jobs-watchdog-rank{self.rank}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self._check_every):
            last = self._last
            if last is None:
                continue
            idle, limit = time.monotonic() - last, self.limit()
            if idle > limit and not self._stop.is_set():
                self._fire(idle, limit)
                return

    def _fire(self, idle: float, limit: float) -> None:
        self.fired = True
        stream = self._stream or sys.stderr
        steps = list(self._times)
        median = statistics.median(steps) if steps else 0.0
        head = (
            f"dist-jobs: rank {self.rank}: hang watchdog: no optimizer step completed for {idle:.0f} s "
            f"(limit {limit:.0f} s = max({self.factor:g} x median step {median:.3g} s, {self.floor_s:g} s)); "
            f"the stacks of all this process's threads follow, then exit {REQUEUE_EXIT_CODE} "
            "to be requeued and resume from the last checkpoint\n"
        )
        # One write of the whole dump: in torchrun mode the ranks of a node share one log, and
        # their dumps, written at the same moment, must not interleave line by line.
        stream.write(head + _stacks() + f"dist-jobs: rank {self.rank}: end of the stacks\n")
        stream.flush()
        if self._on_fire is not None:
            try:
                self._on_fire()
            except Exception as exc:  # the exit below matters more than the marker
                stream.write(f"dist-jobs: rank {self.rank}: hang watchdog: leaving the requeue marker failed: {exc}\n")
        stream.flush()
        time.sleep(self._linger)
        self._exit(REQUEUE_EXIT_CODE)


def _stacks() -> str:
    """faulthandler's dump of every thread, as text (it writes only to a file descriptor)."""
    try:
        with tempfile.TemporaryFile() as buffer:
            faulthandler.dump_traceback(file=buffer, all_threads=True)
            buffer.seek(0)
            return buffer.read().decode("utf-8", errors="replace")
    except OSError:  # no temporary file to be had (a full or read-only /tmp): straight to stderr
        faulthandler.dump_traceback(file=sys.__stderr__ or sys.stderr, all_threads=True)
        return ""
