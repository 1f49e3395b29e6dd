"""The run directory lock from the trainer's side (dist_jobs.rundir.lock has the protocol).

Rank 0 joins the lock its launcher took (the local launcher, the sbatch script and the pod
entrypoint export DIST_JOBS_LOCK_TOKEN), or takes one itself where nothing did: a hand-made
torchrun or srun launch, a submitit job, your own script calling fit(). Every rank learns
whether rank 0 may go on before any of them touches the run directory, so a refused run ends
on every rank with the same exit code (2) instead of leaving peers waiting in a collective.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from dist_jobs.errors import UsageError
from dist_jobs.rundir.holder import Holder, owner_from_env
from dist_jobs.rundir.lock import Heartbeat, Lock, acquire, new_token
from dist_jobs.train.distributed import Dist, all_reduce

log = logging.getLogger("dist_jobs.train")


def _take(folder: Path) -> Lock:
    env = os.environ
    backend = env.get("DIST_JOBS_BACKEND", "").strip() or "trainer"
    me = Holder.this(new_token(), owner_from_env(env), backend, env.get("SLURM_JOB_ID", ""))
    lock = acquire(folder, me, inherited=env.get("DIST_JOBS_LOCK_TOKEN", "").strip())
    if lock.took_over:
        log.warning("took over the lock of %s: %s", folder, lock.took_over)
    return lock


def _lost(folder: Path) -> None:
    log.error("lost the lock of %s: another run took it over and may write there now", folder)


@contextmanager
def run_lock(folder: Path | None, dist: Dist) -> Iterator[None]:
    """Hold `folder`'s lock (rank 0) for the block; raise the refusal on every rank."""
    if folder is None:
        yield
        return
    lock: Lock | None = None
    refusal: UsageError | None = None
    if dist.is_main:
        try:
            lock = _take(folder)
        except UsageError as exc:
            refusal = exc
    flag = torch.tensor([int(refusal is not None)], dtype=torch.int32)
    all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=dist.control)
    if refusal is not None:
        raise refusal
    if flag.item():
        raise UsageError(f"rank 0 was refused the lock of {folder}", hint="rank 0's message names the run holding it")
    try:
        with Heartbeat(lock, on_lost=lambda _: _lost(folder)) if lock else nullcontext():
            yield
    finally:
        if lock is not None:
            lock.release()
