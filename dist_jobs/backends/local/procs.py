"""Run a set of processes as one job: prefixed output, one end for all of them, no orphans.

Each process runs under a keeper (keeper.py, Linux) in its own session, so that a
terminal's Ctrl-C reaches only us. SIGINT, SIGTERM and SIGHUP to the launcher all mean the
same: every process gets the job's preemption signal (the training checkpoints at the next step
boundary and exits with REQUEUE_EXIT_CODE), whatever is left after the grace period is killed,
and the launcher exits last. A second such signal kills at once. The keepers watch a pipe only
the launcher holds: when the launcher dies, even by SIGKILL, every keeper kills its process
tree (torchrun's workers included) within a fraction of a second.

Exit codes of `run` (the launcher's exit code):
  0                     every process exited 0
  200 (REQUEUE)         stopped by a preemption signal, and every process exited 200 (or rank 0
                        left a PREEMPTED marker newer than the start): checkpointed, run it again;
                        or a rank's hang watchdog exited 200 and left a hang record newer than the
                        start: the others, hung with it, are killed at once (no grace: a stopped
                        process would never checkpoint), and it is run again from the last checkpoint
  128+N                 the launcher got signal N (130 INT, 143 TERM, 129 HUP) and the processes
                        did not all checkpoint: some were killed or had no checkpointing
  the process's code    the first process that failed (128+N when signal N killed it); the
                        others were stopped
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TextIO

from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.rundir.verdict import Action, Evidence, Failure, Verdict, decide

GRACE_SECONDS = 30.0
PEER_LOST_WAIT = 5.0  # seconds the others get after a process exited 200 on a lost peer
POLL_SECONDS = 0.05  # how often a launcher outside the main thread (no signal handlers) looks
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KEEPER = Path(__file__).with_name("keeper.py")
# The keeper needs prctl (parent-death signal, child subreaper) and /proc: Linux.
USE_KEEPER = sys.platform.startswith("linux")


class _Signals:
    """The launcher's stop signals, recorded by a handler that does nothing else; and the wait
    between two looks at the processes, which any signal (a keeper's SIGCHLD too) or wake() ends.
    Event-driven because a timed poll would wake beside the busy ranks many times a second."""

    def __init__(self) -> None:
        self.received: list[signal.Signals] = []
        self._previous: dict[int, object] = {}
        self._woken, self._wake = os.pipe()
        os.set_blocking(self._wake, False)
        self._armed = False  # only the main thread may set handlers: elsewhere sleep() polls
        self._wakeup_before = -1
        self._closing = threading.Lock()
        self.continued = False  # set on SIGCONT: the launcher ran again after a stop

    def _continued(self, *_: object) -> None:
        self.continued = True

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, lambda n, _: self.received.append(signal.Signals(n)))
            self._previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
            self._previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._continued)
            self._wakeup_before = signal.set_wakeup_fd(self._wake, warn_on_full_buffer=False)
            self._armed = True
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        if self._armed:
            signal.set_wakeup_fd(self._wakeup_before)
        with self._closing:  # a late wake() must not write into whatever reuses the descriptor
            os.close(self._woken)
            os.close(self._wake)
            self._wake = -1

    def wake(self) -> None:
        with self._closing:
            if self._wake >= 0:
                try:
                    os.write(self._wake, b"\0")
                except BlockingIOError:  # full: a wake-up is pending anyway
                    pass

    def sleep(self, timeout: float | None) -> None:
        """Until a signal arrives, wake() is called or `timeout` seconds (None: no limit) pass."""
        if not self._armed:
            timeout = POLL_SECONDS if timeout is None else min(timeout, POLL_SECONDS)
        if select.select([self._woken], [], [], timeout)[0]:
            os.read(self._woken, 4096)


class ProcessGroup:
    def __init__(
        self,
        out: TextIO,
        grace: float = GRACE_SECONDS,
        stop_signal: int = signal.SIGTERM,
        preempted: Callable[[float], bool] | None = None,
        hung: Callable[[float], str] | None = None,
        still_ours: Callable[[], bool] | None = None,
    ) -> None:
        self.out = out
        self.grace = grace
        self.stop_signal = signal.Signals(stop_signal)
        self.preempted = preempted  # given the start time: did rank 0 commit a preemption checkpoint?
        self.hung = hung  # given the start time: the hang record's sentence, if a watchdog left one since
        # After a stop (Ctrl-Z, SIGSTOP), whether the run directory's lock is still ours: the keepers
        # stopped the processes with us, and continue them only on our word (a SIGCONT of ours).
        self.still_ours = still_ours
        self.lost: str | None = None  # set by end_now(): end the run now, with this message
        self._signals: _Signals | None = None
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._labels: list[str] = []
        self.restarts_left = 0  # restarts in place the launcher may still do: a fault's verdict is restart
        self.verdict: Verdict | None = None  # after run(): how it ended

    def end_now(self, why: str) -> None:
        """From any thread: kill every process and end the run, saying why."""
        self.lost = why
        if self._signals is not None:
            self._signals.wake()

    def say(self, text: str) -> None:
        with self._lock:
            self.out.write(f"dist-jobs: {text}\n")
            self.out.flush()

    def _pump(self, label: str, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.out.write(f"[{label}] {line}\n")
                self.out.flush()
        stream.close()

    def _start(
        self, jobs: list[tuple[str, list[str], dict[str, str]]], cwd: os.PathLike[str], watch: int
    ) -> list[threading.Thread]:
        pumps = []
        for label, argv, env in jobs:
            wrapped = [sys.executable, "-I", str(KEEPER), str(watch), "--", *argv] if USE_KEEPER else argv
            proc = subprocess.Popen(
                wrapped,
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(watch,) if USE_KEEPER else (),
            )
            self._procs.append(proc)
            self._labels.append(label)
            pump = threading.Thread(target=self._pump, args=(label, proc.stdout), daemon=True)
            pump.start()
            pumps.append(pump)
        return pumps

    def run(self, jobs: list[tuple[str, list[str], dict[str, str]]], cwd: os.PathLike[str]) -> int:
        """Start every job, supervise them to the end; the launcher's exit code (module doc)."""
        started = time.time()
        watch, hold = os.pipe()  # `hold` stays here: its closing is the keepers' signal to kill
        pumps: list[threading.Thread] = []
        with _Signals() as signals:  # also through the teardown: a Ctrl-C there must not cut it short
            self._signals = signals
            try:
                try:
                    pumps = self._start(jobs, cwd, watch)
                finally:
                    os.close(watch)
                outcome = self._supervise(signals, started)
            finally:
                os.close(hold)
                self._reap(5.0)
                self._signal_all(signal.SIGKILL)  # no keeper (not Linux), or one that did not answer
                self._reap(5.0)
                for pump in pumps:
                    pump.join(timeout=5.0)
                self._signals = None
        return self._verdict(outcome, started)

    def _stop(self, why: str, failed: bool = False) -> float:
        # A process that failed (a missing script, a crash) ends the run: the others are stopped,
        # and saying they checkpoint as if preempted would misread what happened.
        what = (
            "stopping the others"
            if failed
            else "the training checkpoints at its next step boundary and exits " + str(REQUEUE_EXIT_CODE)
        )
        self.say(
            f"{why}: sending {self.stop_signal.name} to every process ({what}); "
            f"what is left in {self.grace:.0f} s is killed"
        )
        self._signal_all(self.stop_signal)
        return time.monotonic() + self.grace

    def _supervise(self, signals: _Signals, started: float) -> _Outcome:
        """Until every process has exited, or the end must be forced; what happened on the way."""
        outcome = _Outcome()
        deadline: float | None = None
        while True:
            codes = [self._code(p) for p in self._procs]
            bad = next((i for i, c in enumerate(codes) if c not in (None, 0, REQUEUE_EXIT_CODE)), None)
            if bad is not None and deadline is None:  # a failure of its own, not our stop's effect
                outcome.failure, outcome.first = codes[bad], bad
                if None in codes:
                    deadline = self._stop(f"{self._labels[bad]} failed ({describe_exit(codes[bad])})", failed=True)
            if None not in codes:
                return outcome
            if len(signals.received) > 1:
                self.say(f"got {signals.received[-1].name} again: killing every process now")
                return outcome.forced_end()
            if signals.received and outcome.cause is None:
                outcome.cause = signals.received[0]
                deadline = self._stop(f"got {outcome.cause.name}")
            if signals.continued:
                signals.continued = False
                self._continue()
            if self.lost is not None:
                self.say(self.lost)
                outcome.failure, outcome.first = 1, None
                outcome.why = "lost the run directory lock; every process was killed"
                return outcome.forced_end()
            hang = self.hung(started) if deadline is None and REQUEUE_EXIT_CODE in codes and self.hung else ""
            if hang:
                left = sum(c is None for c in codes)
                self.say(f"a rank's hang watchdog exited {REQUEUE_EXIT_CODE}: killing the {left} left, hung with it")
                outcome.hang = hang
                return outcome.forced_end()
            if deadline is None and REQUEUE_EXIT_CODE in codes:
                deadline = time.monotonic() + self._requeue_wait(outcome, started)
            if deadline is not None and time.monotonic() > deadline:
                left = sum(c is None for c in codes)
                self.say(f"{left} of {len(codes)} processes still running: killing them")
                return outcome.forced_end()
            signals.sleep(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _requeue_wait(self, outcome: _Outcome, started: float) -> float:
        """How long the others may take once a process exited 200. After a preemption (our stop
        signal, or rank 0's PREEMPTED marker) they are checkpointing too: the grace period. Else
        the process lost a peer: no one checkpoints, and a peer that is stopped or hung would
        never exit; PEER_LOST_WAIT only lets rank 0 finish a marker it was writing."""
        if outcome.cause is not None or (self.preempted is not None and self.preempted(started)):
            return self.grace
        return min(self.grace, PEER_LOST_WAIT)

    def _verdict(self, outcome: _Outcome, started: float) -> int:
        """What the run's end means (dist_jobs.rundir.verdict decides; kept in `self.verdict`),
        said in a line; the launcher's exit code."""
        codes = [self._code(p) for p in self._procs]
        checkpointed = not outcome.forced and (
            all(c == REQUEUE_EXIT_CODE for c in codes) or (self.preempted is not None and self.preempted(started))
        )
        failures: tuple[Failure, ...] = ()
        first, code = outcome.first, outcome.failure
        if code is None:  # none failed while all ran: a rank that failed says more than one that checkpointed
            first = next((i for i, c in enumerate(codes) if c not in (None, 0, REQUEUE_EXIT_CODE)), None)
            code = codes[first] if first is not None else None
        if code is not None and first is not None:
            failures = (_failure(self._labels[first], code),)
        exit_code = code if code is not None else next((c for c in codes if c), 0)
        evidence = Evidence(
            exit_code=exit_code,
            failures=failures,
            preempted=checkpointed,
            # a stop signal to the launcher ends the run unless every rank checkpointed on it
            cancelled=outcome.cause is not None and not checkpointed,
            lock_lost=self.lost is not None,
            hang=outcome.hang,
            said="every rank checkpointed" if checkpointed else "",
        )
        if outcome.cause is not None and not checkpointed:
            said = f"stopped by {outcome.cause.name} before every rank checkpointed"
            evidence = replace(evidence, exit_code=128 + outcome.cause, said=said)
        self.verdict = decide(evidence, restarts_left=self.restarts_left)
        if self.verdict.action is not Action.DONE:  # a run that ended well says nothing more
            self.say(f"exit code {self.verdict.exit_code}: {self.verdict.told()}")
        return self.verdict.exit_code

    def _continue(self) -> None:
        """Running again after a stop: the keepers continue the processes when the lock is still
        ours; when another run took it over meanwhile, they stay stopped until they are killed."""
        if self.still_ours is not None and not self.still_ours():
            self.end_now(self.lost or "this run was stopped and another run took its lock over meanwhile")
            return
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)

    @staticmethod
    def _code(proc: subprocess.Popen[bytes]) -> int | None:
        code = proc.poll()
        return None if code is None else 128 - code if code < 0 else code  # signal N -> 128+N, like a shell

    def _signal_all(self, sig: int) -> None:
        # The whole group: the keeper and its process (torchrun's workers get it from torchrun).
        # A keeper exits after its tree, so a reaped one leaves nothing, and its pid may be reused.
        for proc in self._procs:
            if USE_KEEPER and proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


@dataclass
class _Outcome:
    cause: signal.Signals | None = None  # the launcher's first stop signal
    failure: int | None = None  # the first process's own failure
    first: int | None = None  # which process that was
    forced: bool = False  # the end was forced: killed, not waited for
    hang: str = ""  # a rank's hang watchdog ended it (the others were killed, not waited for): its record, told
    why: str | None = None  # what the exit code means, where a failure is not a process's own

    def forced_end(self) -> _Outcome:
        self.forced = True
        return self


def _failure(label: str, code: int) -> Failure:
    """The failure of the process `label`: a rank ("rank 3"), or a node's torchrun ("node 1"),
    which the verdict names as the node it failed on."""
    unit, _, number = label.partition(" ")
    if unit == "rank" and number.isdigit():
        return Failure(int(number), "", code)
    return Failure(None, label, code)
