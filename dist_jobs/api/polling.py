"""The one wait loop of Job.wait, dist_jobs.wait_all and Sweep.wait.

Each poll asks each scheduler once for all the jobs watched on it (dist_jobs.api.job.statuses:
SLURM's is one `squeue` and one `sacct` whatever the number of jobs). Between polls the wait
backs off: it starts at `poll` seconds and grows by half each time up to `max_poll`, so a long
wait asks rarely and a short job is still seen ending soon after it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from dist_jobs.errors import DistJobsError

T = TypeVar("T")

FIRST_POLL_S = 2.0
MAX_POLL_S = 15.0  # a wait of hours asks the scheduler 4 times a minute, not 30
GROWTH = 1.5


def intervals(first: float, longest: float) -> Callable[[], float]:
    """Each call: the next pause; `first`, then half as long again each time, up to `longest`."""
    state = {"next": first}

    def pause() -> float:
        now = state["next"]
        state["next"] = min(max(longest, first), now * GROWTH)
        return now

    return pause


def poll_until(
    check: Callable[[], tuple[bool, T]],
    timeout: float | None,
    expired: Callable[[T], DistJobsError],
    poll: float | None = None,
    max_poll: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`check()` until it says done; its value. After `timeout` seconds, raise `expired(value)`."""
    deadline = None if timeout is None else clock() + timeout
    pause = intervals(FIRST_POLL_S if poll is None else poll, MAX_POLL_S if max_poll is None else max_poll)
    while True:
        done, value = check()
        if done:
            return value
        now = clock()
        if deadline is not None and now >= deadline:
            raise expired(value)
        wait = pause()
        sleep(wait if deadline is None else max(0.0, min(wait, deadline - now)))
