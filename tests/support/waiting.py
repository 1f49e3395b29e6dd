"""`eventually()`: the one way a test waits for something another process does; `HUNG_S`: how
long a test waits on another process before it calls it hung.

Polls `check()` until it returns something truthy and returns that. On the deadline the test
fails with what it waited for, how long, the last value `check()` returned (or the exception it
raised) and, when given, `context()`: the job's status, a log's tail, whatever says why. Every
polling test uses it, so a timeout always says what it last saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# How long a test waits on another process (its exit, its output, a file it writes) before it calls
# it hung: a guard, not a measure, so one figure for every such wait. It is generous because the
# torch-free sessions run at nice 10 beside the full session (Makefile `test`), where a script that
# takes 5 s alone has taken over 60.
HUNG_S = 300

_FAIL: Any = object()  # `default` not given: the deadline fails the test


def eventually(
    check: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.25,
    context: Callable[[], object] | None = None,
    on_timeout: Callable[[], object] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
    until: Callable[[T], object] | None = None,
    give_up: Callable[[], object] | None = None,
    default: T = _FAIL,
) -> T:
    """`check()`'s first truthy value, polled every `interval` s for at most `timeout` s.

    `retry_on`: exceptions that mean "not yet" (a file not written yet, an API not answering);
    the last one is shown on failure. `on_timeout` runs before the failure (cancel the job).
    `until`: when given, `check()`'s value is returned once `until(value)` is truthy rather than
    once the value is: the value shown on failure is then the real one (a job's state, a list of
    pids), not a bare False. `give_up`: looked at after each value that is not yet it; something
    truthy (say which process exited) means it can no longer come: fail at once, as on the
    deadline, showing that. `default`: a wait that may run out without failing the test (pods
    that may still end by themselves): on the deadline return it instead, on_timeout not run.
    """
    started = time.monotonic()
    deadline = started + timeout
    last: object = None
    gave: object = None
    while True:
        try:
            value = check()
        except retry_on as exc:
            last = exc
        else:
            if until(value) if until is not None else value:
                return value
            last = value
        if give_up is not None and (gave := give_up()):
            break
        if time.monotonic() >= deadline:
            if default is not _FAIL:
                return default
            break
        time.sleep(interval)
    if on_timeout is not None:
        on_timeout()
    detail = f"\n{context()}" if context is not None else ""
    if gave:
        why = f"gave up waiting for {what} after {time.monotonic() - started:.1f} s: {gave!r}"
    else:
        why = f"waited {timeout:.0f} s for {what}"
    pytest.fail(f"{why} (last seen: {last!r}){detail}", pytrace=False)


def side_by_side(*scenarios: Callable[[], object]) -> None:
    """Run each scenario in a thread of its own and wait for all of them; then raise the first
    one's failure, in the order given. For cluster jobs whose test mostly waits on the scheduler's
    own timers (a time limit, a requeue's hold): two such jobs at once cost the wait once."""
    with ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
        futures = [pool.submit(scenario) for scenario in scenarios]
    for future in futures:
        future.result()
