"""Preemption signals: the handler only records that one arrived; the loop acts at a step boundary.

A handler runs between two bytecodes of whatever the main thread is doing: inside a collective,
half-way through torch.save, in the optimizer step. Doing real work there (saving, exiting)
would leave a torn checkpoint or a peer waiting in an all_reduce forever, so the handler sets
an attribute and nothing else. The loop polls it, all ranks agree, then they checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

from dist_jobs.errors import UsageError

log = logging.getLogger(__name__)

_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
# Signals a launch mode adds to `train.preempt_signals` (submitit warns with SIGUSR2), so that
# your own function calling fit() checkpoints on them too.
LAUNCH_SIGNALS_VAR = "DIST_JOBS_PREEMPT_SIGNALS"


def preempt_signals(configured: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The configured signals plus the launch mode's, in order, each once."""
    env = os.environ if environ is None else environ
    extra = [s for s in env.get(LAUNCH_SIGNALS_VAR, "").split(",") if s.strip()]
    return tuple(dict.fromkeys([*configured, *extra]))


def parse_signal(name: str) -> signal.Signals:
    """'SIGUSR1', 'USR1' or '10' -> signal.SIGUSR1; a UsageError naming the field otherwise."""
    text = name.strip().upper()
    try:
        sig = (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else "SIG" + text]
        )
    except (KeyError, ValueError):
        raise UsageError(
            f"preempt_signals: {name!r} is not a signal of this system",
            hint="use names such as SIGUSR1,SIGUSR2,SIGTERM (see `kill -l`)",
        ) from None
    if sig in _UNCATCHABLE:
        raise UsageError(
            f"preempt_signals: {sig.name} cannot be caught by any process",
            hint="ask the scheduler for a catchable signal, e.g. SIGUSR1 or SIGTERM",
        )
    return sig


class PreemptFlag:
    """Context manager: on enter, the listed signals set `received`; on exit, old handlers return.

    Truthy once a signal arrived. Signals can only be handled in the main thread; elsewhere
    (fit() called from a worker thread) the flag never fires and a warning says so.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.signals = [parse_signal(name) for name in names]
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __bool__(self) -> bool:
        return self.received is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def __enter__(self) -> PreemptFlag:
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "training runs outside the main thread: preemption signals %s are not "
                "handled, a preempted run will not checkpoint first",
                ",".join(s.name for s in self.signals),
            )
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        for sig, previous in self._previous.items():
            # None means a handler installed from C; the default is the closest we can restore.
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
