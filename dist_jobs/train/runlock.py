"""The run directory lock from the trainer's side (dist_jobs.rundir.lock has the protocol).

Rank 0 joins the lock its launcher took (the local launcher, the sbatch script and the pod
entrypoint export DIST_JOBS_LOCK_TOKEN), or takes one itself where nothing did: a hand-made
torchrun or srun launch, a submitit job, your own script calling fit(). Every rank learns
whether rank 0 may go on before any of them touches the run directory, so a refused run ends
on every rank with the same exit code (2) instead of leaving peers waiting in a collective.

A run can lose the lock while it runs: paused (SIGSTOP, a suspended SLURM job, a VM or NFS
pause) past the stale limit, another run takes the folder over. Two things stop it from then
writing beside that run: every rank learns the lock's token and checks it (`Guard.check`) right
before each write into the run directory, and rank 0 watches the lock (beating it when it took
it itself) so the loop stops at the next step boundary, without saving (`Guard.lost`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from dist_jobs.errors import UsageError
from dist_jobs.rundir.holder import Holder, owner_from_env
from dist_jobs.rundir.lease import Heartbeat
from dist_jobs.rundir.lock import LOCK_NAME, Fence, Lock, LockLost, acquire, new_token
from dist_jobs.train.distributed import Dist, max_over_ranks

log = logging.getLogger("dist_jobs.train")
# Room for any token a launcher makes (uuid4().hex here, a uuid with dashes in the pod entrypoint):
# every rank must all-reduce the same number of values.
_TOKEN_BYTES = 128


@dataclass
class Guard:
    """This run's hold on its run directory, as the training loop sees it."""

    fence: Fence | None = None  # None: no run directory, nothing to guard
    lost: threading.Event = field(default_factory=threading.Event)  # rank 0 saw the lock go
    told: bool = False  # the loss was logged

    def check(self, doing: str) -> None:
        """Raise LockLost unless this run still holds the lock; `doing` names the write."""
        if self.fence is None:
            return
        try:
            self.fence.check(doing)
        except LockLost:
            self.lost.set()
            raise

    @property
    def stamp(self) -> str:
        """What this run's staged checkpoint folders are named by (Fence.stamp); "" unguarded."""
        return "" if self.fence is None else self.fence.stamp

    def holds(self, doing: str) -> bool:
        """check() for writes that may be skipped (progress): False, logged once, when lost. Once the
        loss is known, no more look at the lock: threads that write (the watchdog's beat) ask often."""
        if self.lost.is_set():
            return False
        try:
            self.check(doing)
        except LockLost as exc:
            if not self.told:
                self.told = True
                log.error("%s", exc)
            return False
        return True


def _take(folder: Path) -> Lock:
    env = os.environ
    backend = env.get("DIST_JOBS_BACKEND", "").strip() or "trainer"
    me = Holder.this(new_token(), owner_from_env(env), backend, env.get("SLURM_JOB_ID", ""))
    lock = acquire(folder, me, inherited=env.get("DIST_JOBS_LOCK_TOKEN", "").strip(), on_wait=log.warning)
    if lock.took_over:
        log.warning("took over the lock of %s: %s", folder, lock.took_over)
    if len(lock.token.encode()) > _TOKEN_BYTES or not lock.token.isascii():
        lock.release()
        raise UsageError(
            f"the run directory lock's token {lock.token[:40]!r}... is not {_TOKEN_BYTES} ASCII bytes or fewer",
            hint="DIST_JOBS_LOCK_TOKEN is set by dist-jobs' launchers: do not set it yourself",
        )
    return lock


def _share(lock: Lock | None, refused: bool, dist: Dist) -> tuple[bool, str]:
    """Rank 0's answer on every rank: (refused, the lock's token). Every rank all-reduces the
    same number of values, whatever the token's length."""
    mine = [int(refused), *(lock.token.encode() if lock else b"")]
    values = max_over_ranks(mine + [0] * (1 + _TOKEN_BYTES - len(mine)), group=dist.control)
    return bool(values[0]), bytes(v for v in values[1:] if v).decode()


@contextmanager
def run_lock(folder: Path | None, dist: Dist) -> Iterator[Guard]:
    """Hold `folder`'s lock (rank 0) for the block; raise the refusal on every rank."""
    if folder is None:
        yield Guard()
        return
    lock: Lock | None = None
    refusal: UsageError | None = None
    if dist.is_main:
        try:
            lock = _take(folder)
        except UsageError as exc:
            refusal = exc
    refused, token = _share(lock, refusal is not None, dist)
    if refusal is not None:
        raise refusal
    if refused:
        raise UsageError(f"rank 0 was refused the lock of {folder}", hint="rank 0's message names the run holding it")
    guard = Guard(Fence(folder / LOCK_NAME, token))

    def lost(successor: Holder | None) -> None:
        guard.lost.set()
        if lock is not None and lock.failure:
            log.error("run directory lock in %s: %s", folder, lock.failure)
        log.error("%s", LockLost(folder, successor, "take another step"))

    try:
        # Rank 0 beats the lock it took, and only watches one its launcher took (the launcher beats).
        with Heartbeat(lock, on_lost=lost) if lock else nullcontext():
            yield guard
    finally:
        if lock is not None:
            lock.release()  # only while the file still names us
