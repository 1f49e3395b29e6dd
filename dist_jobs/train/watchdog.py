"""The hang watchdog: a rank that completes no optimizer step for too long dumps its stacks and exits
with the retryable code, so the scheduler requeues the job and it resumes from its last checkpoint.

Every rank runs one. The hot loop only calls `beat()` after each optimizer step (a clock read and
a deque append: no collective, no lock, no syscall beyond the clock); a daemon thread runs
`check()` every second or so, which compares the time since the last beat with
    limit = min(max(factor x median of the recent step times, floor_s), cap),
    cap = the collective timeout minus `headroom()`.
A stalled rank and the peers waiting for it in a collective all stop stepping, so all of them
fire. Firing writes every thread's Python stack to stderr (the rank's log) with faulthandler,
which works from this thread while the main thread is stuck, then leaves the marker the batch
script and the pod entrypoint turn into the requeue code (torchrun does not pass exit codes on)
and the hang record status reads, flushes every log handler and the standard streams, and ends
the process with os._exit(REQUEUE_EXIT_CODE): the main thread may be inside a C collective that
never returns to Python, so raising or sys.exit() there would never happen, and os._exit
flushes nothing by itself.

The cap: a collective that waits longer than its timeout aborts the process (NCCL: SIGABRT, 134,
not requeued, no stack dump). A rank stuck in a collective entered it after its last beat, so
the watchdog's idle time is never shorter than the collective's wait: firing at a limit that,
plus one check, the dump and the linger, ends before the timeout always wins the race.

Checkpoints: a save (its state_dict() calls, the write, rank 0's commit) and a wait for an
asynchronous one take as long as the bytes take, which has nothing to do with the step time.
They run inside `paused()`, which stops the watch and restarts the clock when it ends. Pausing
rather than beating while bytes flow, because much of a save moves no bytes we could see
(a user's state_dict() gathering its state, rank 0 waiting for the other ranks' files) and the
ranks that are not saving wait for rank 0 in a collective meanwhile; the trainer's saves end
with a barrier inside the pause so that every rank leaves them together, and so that while
one rank is paused its peers are inside the watch too. A pause silences this rank's own idle
time, not its peers: a peer whose whole process stopped during a save (SIGSTOP, a dead node)
leaves no beat, and the rank that watches it (the next rank, in a ring: one beat file read
per check, and every rank watched by one) fires once that silence exceeds the limit, instead of
waiting out the collective timeout in the save's barrier. A save that never ends is still
bounded: rank 0 waits for the other ranks' files at most the checkpointer's finalize_timeout;
a rank whose own write never returns leaves its peers in that barrier until the collective
timeout, which ends them with the retryable PeerLost exit, and the launcher (srun
--kill-on-bad-exit, torchrun, the local backend) then kills it. Only when every rank's write
hangs (a dead shared file system) does nothing in the process end it: the job's time limit
does, and nothing could, since a write stuck in the kernel ignores even SIGKILL.

Stopped time: a process stopped by SIGSTOP, a SLURM suspend or a paused VM did not hang, but the
monotonic clock kept running. The thread notices its own wake-up came far later than it asked
(`STOPPED_CHECKS` intervals or more), says so in one line and restarts the clock from then.

Which rank: every rank whose peers wait for it fires, so the firing rank is rarely the one that
stopped. `on_tick` (dist_jobs.train.live) runs on the thread at every check, where it leaves the
rank's beat (dist_jobs.rundir.beats) for the others to compare when they fire; `waits_in()` says
what the training thread is blocked in, from its Python stack, as the beats and the record tell.

Before the first step (start-up, resuming, compiling) nothing is watched: the rendezvous and
collective timeouts cover those. Evaluation `touch()`es it, so the clock restarts from each
batch without their time counting as a step.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from dist_jobs.constants import REQUEUE_EXIT_CODE

# Step times the median is taken over: recent enough to follow a change of pace.
WINDOW = 200
# A wake-up this many check intervals late is not a busy machine but a stopped process.
STOPPED_CHECKS = 10
# How long the firing thread waits for the log handlers' flush: a handler whose lock the stuck
# main thread holds (a write into a full pipe) must not keep the process from exiting.
FLUSH_WAIT_S = 5.0


def default_check_every(floor_s: float) -> float:
    return min(1.0, max(floor_s / 10, 0.01))


def headroom(collective_timeout_s: float, check_every_s: float, linger_s: float) -> float:
    """How far below the collective timeout the limit stays: one check late at most, the linger,
    one more check for the dump and the records, and never less than a twentieth of the timeout
    (a slow shared file system under the log and the run directory)."""
    return max(2 * check_every_s + linger_s, collective_timeout_s / 20)


class Watchdog:
    """Use as a context manager around the training; `beat()` after every optimizer step.

    `clock` (monotonic seconds) and calling `check()` by hand let tests drive it without a thread.
    """

    def __init__(
        self,
        factor: float,
        floor_s: float,
        *,
        collective_timeout_s: float | None = None,
        rank: int = 0,
        on_fire: Callable[[Watchdog], None] | None = None,
        on_tick: Callable[[Watchdog], None] | None = None,
        peer_silence: Callable[[], tuple[int, float] | None] | None = None,
        stream: TextIO | None = None,
        exit: Callable[[int], object] = os._exit,
        check_every_s: float | None = None,
        linger_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factor, self.floor_s, self.rank = factor, floor_s, rank
        self.collective_timeout_s = collective_timeout_s
        self._on_fire = on_fire
        self._on_tick = on_tick
        # The rank this one watches and how long it has left no beat (None: no beat to judge).
        self._peer_silence = peer_silence
        self._stream = stream
        self._exit = exit
        self._clock = clock
        self._check_every = check_every_s if check_every_s is not None else default_check_every(floor_s)
        # After its dump, a firing rank waits this long before exiting: its peers, stalled in the
        # same collective since the same step, fire within one check and dump their stacks too
        # before the launcher (srun --kill-on-bad-exit, torchrun) kills them for this exit.
        self._linger = linger_s if linger_s is not None else 3 * self._check_every
        self.cap: float | None = None
        if collective_timeout_s is not None:
            room = headroom(collective_timeout_s, self._check_every, self._linger)
            self.cap = max(collective_timeout_s - room, self._check_every)
        self._times: deque[float] = deque(maxlen=WINDOW)
        self._last: float | None = None  # None: not armed (no step completed yet)
        self._checked: float | None = None  # when check() last ran
        # Since when this process has been awake: silence from before a stop of its own (the whole
        # job suspended) is not a peer's.
        self._awake = clock()
        self._paused = 0  # nesting depth of paused(); only the training thread changes it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.step: int | None = None  # the last step beat() was told of
        self.fired = False
        self.trainer: int | None = None  # the training thread's ident: the one that entered
        self._tick_failed = False

    @property
    def check_every(self) -> float:
        return self._check_every

    def beat(self, step: int | None = None) -> None:
        """One optimizer step completed on this rank (`step`: its number, for the hang record)."""
        now = self._clock()
        last = self._last
        if last is not None:
            self._times.append(now - last)
        self._last = now
        if step is not None:
            self.step = step

    def touch(self) -> None:
        """Work other than a step (evaluation) made progress: restart the clock."""
        if self._last is not None:
            self._last = self._clock()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No firing inside (a checkpoint save or a wait for one); the clock restarts at its end."""
        self._paused += 1
        try:
            yield
        finally:
            self.touch()  # before unpausing: a check in between must not see the old beat
            self._paused -= 1

    def wanted(self) -> float:
        """The limit before the cap: max(factor x median step, floor)."""
        steps = list(self._times)
        median = statistics.median(steps) if steps else 0.0
        return max(self.factor * median, self.floor_s)

    def limit(self) -> float:
        wanted = self.wanted()
        return wanted if self.cap is None else min(wanted, self.cap)

    def __enter__(self) -> Watchdog:
        self.trainer = threading.get_ident()
        self._checked = self._awake = self._clock()
        self._thread = threading.Thread(target=self._watch, name=f"dist-jobs-watchdog-rank{self.rank}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        self.tick()  # the first beat at once: a rank that stops early is compared too
        while not self._stop.wait(self._check_every):
            self.tick()
            if self.check():
                return

    def tick(self) -> None:
        """`on_tick`, as the thread runs it before each check; its failure must not end the watch."""
        if self._on_tick is None:
            return
        try:
            self._on_tick(self)
        except Exception as exc:
            if not self._tick_failed:
                self._write(f"dist-jobs: rank {self.rank}: hang watchdog: leaving its beat failed: {exc} (goes on)\n")
            self._tick_failed = True

    def check(self) -> bool:
        """One look, as the thread takes every check interval; True when it fired."""
        now = self._clock()
        previous, self._checked = self._checked, now
        if previous is not None and now - previous >= STOPPED_CHECKS * self._check_every:
            self._discount(now - previous)
            return False
        last = self._last
        if self.fired or last is None or self._stop.is_set():
            return False
        if self._paused:
            return self._peer_stopped(now)
        idle, limit = now - last, self.limit()
        if idle <= limit:
            return False
        self._fire(f"no optimizer step completed for {idle:.0f} s ({self._limit_text(limit)})")
        return True

    def _peer_stopped(self, now: float) -> bool:
        """Inside a save: whether the watched peer has left no beat for longer than the limit (its
        process stopped), in which case this rank fires rather than wait for it until the collective
        timeout. Only once this process has itself been awake that long."""
        limit = self.limit()
        if self._peer_silence is None or now - self._awake <= limit:
            return False
        silent = self._peer_silence()
        if silent is None or silent[1] <= limit:
            return False
        peer, seconds = silent
        self._fire(
            f"rank {peer} has left no beat for {seconds:.0f} s while this rank waits in a checkpoint save "
            f"({self._limit_text(limit)}): its process stopped (SIGSTOP, a frozen or dead node)"
        )
        return True

    def _discount(self, gap: float) -> None:
        """The process was stopped for most of `gap`: that is not a hang, restart the clock."""
        if self._last is not None:
            self._last = self._clock()  # "now": never older than a beat that raced with this
        self._awake = self._clock()
        self._write(
            f"dist-jobs: rank {self.rank}: hang watchdog: woke up {gap:.0f} s after its previous check "
            f"(it checks every {self._check_every:g} s): this process was stopped (SIGSTOP, a SLURM suspend, "
            "a paused VM); that time does not count, the clock restarts now\n"
        )

    def say(self, text: str) -> None:
        """One line into the rank's log (its stream): from the watchdog thread, where a logging
        handler's lock may be held by the stuck training thread."""
        self._write(f"dist-jobs: rank {self.rank}: hang watchdog: {text}\n")

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(text)
        stream.flush()

    def _fire(self, why: str) -> None:
        self.fired = True
        stream = self._stream or sys.stderr
        headline = (
            f"dist-jobs: rank {self.rank}: hang watchdog: {why}; the stacks of all this process's threads follow, "
            f"then exit {REQUEUE_EXIT_CODE} to be requeued and resume from the last checkpoint\n"
        )
        # One write of the whole dump: in torchrun mode the ranks of a node share one log, and
        # their dumps, written at the same moment, must not interleave line by line.
        stream.write(headline + _stacks() + f"dist-jobs: rank {self.rank}: end of the stacks\n")
        flush_everything(stream)
        if self._on_fire is not None:
            try:
                self._on_fire(self)
            except Exception as exc:  # the exit below matters more than the records
                stream.write(f"dist-jobs: rank {self.rank}: hang watchdog: leaving the requeue marker failed: {exc}\n")
        flush_everything(stream)
        time.sleep(self._linger)
        stream.write(f"dist-jobs: rank {self.rank}: hang watchdog: exiting with {REQUEUE_EXIT_CODE} to be requeued\n")
        flush_everything(stream)
        self._exit(REQUEUE_EXIT_CODE)

    def _limit_text(self, limit: float) -> str:
        steps = list(self._times)
        median = statistics.median(steps) if steps else 0.0
        capped = ""
        if self.collective_timeout_s is not None and limit < self.wanted():
            capped = f", capped to fire before the {self.collective_timeout_s:g} s collective timeout"
        return f"limit {limit:.0f} s = max({self.factor:g} x median step {median:.3g} s, {self.floor_s:g} s){capped}"


def flush_everything(*streams: TextIO | None) -> None:
    """Flush every logging handler and the standard streams, as os._exit will not.

    On a helper thread, waited for at most FLUSH_WAIT_S: a handler's lock may be held forever by
    the stuck thread, and exiting matters more than its last lines."""

    def flush() -> None:
        handlers: list[logging.Handler] = list(logging.root.handlers)
        for logger in list(logging.Logger.manager.loggerDict.values()):
            handlers.extend(getattr(logger, "handlers", ()))  # a PlaceHolder has none
        for target in (*handlers, *streams, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if target is not None:
                    target.flush()
            except Exception:  # a closed stream: flush the others
                pass

    helper = threading.Thread(target=flush, name="dist-jobs-watchdog-flush", daemon=True)
    helper.start()
    helper.join(timeout=FLUSH_WAIT_S)


# dist-jobs' own collectives: all_reduce (FlagPoll, max_over_ranks, the shared-memory reduce)
# or barrier; torch.distributed's are named by their function.
_OURS = ("/dist_jobs/train/distributed.py", "/dist_jobs/train/shm_reduce.py")
# DDP's forward broadcasts rank 0's buffers (BatchNorm's running statistics) before every step:
# a peer that stopped between steps leaves the others blocked there, outside torch/distributed/.
_DDP = "/torch/nn/parallel/distributed.py"
# A save's wait on the other ranks that is not a collective: rank 0's commit polls for every
# rank's file. (A rank waiting for its own write waits for itself: that is its own code.)
_CHECKPOINTER = "/dist_jobs/train/checkpoint/checkpointer.py"


def waits_in(thread: int | None) -> str | None:
    """What thread `thread` is blocked in: a collective's function name (`all_reduce`, `barrier`),
    `backward` (DDP and FSDP reduce the gradients inside it), `broadcast` (DDP's buffers, at
    the start of its forward), a checkpoint's wait for the other ranks' files, "" when in none
    (its own code: a data loader, a file read), None when the thread is unknown. The innermost
    matching frame wins."""
    frame = sys._current_frames().get(thread) if thread is not None else None
    if frame is None:
        return None
    while frame is not None:
        code = frame.f_code
        path = code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in path:
            return code.co_name
        if path.endswith(_OURS):
            return "barrier" if code.co_name == "barrier" else "all_reduce"
        if path.endswith(_DDP) and "broadcast" in code.co_name:
            return "broadcast"
        if path.endswith(_CHECKPOINTER) and code.co_name == "_await_ranks":
            return "the checkpoint's commit"
        if path.endswith("/torch/autograd/graph.py") and code.co_name == "_engine_run_backward":
            return "backward"
        frame = frame.f_back
    return ""


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
