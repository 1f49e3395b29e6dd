"""Lock holders for tests: a holder on another host, and its heartbeat kept going; a local
launcher long gone."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dist_jobs.backends.local.record import Started
from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.holder import Holder, process_start
from dist_jobs.rundir.lease import Heartbeat
from dist_jobs.rundir.lock import LOCK_NAME, Lock, new_token


def foreign(owner: str, backend: str, job_id: str, every: float = 0.05) -> Holder:
    """A holder on another host: nothing here can see whether its process runs, only its heartbeat."""
    holder = Holder.this(new_token(), owner, backend, job_id, every=every)
    return dataclasses.replace(holder, host="elsewhere", pid=99999, boot_id="other-boot")


def plant(run_dir: Path, holder: Holder) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_NAME).write_bytes(holder.to_bytes())
    return run_dir / LOCK_NAME


def take_over(run_dir: Path, holder: Holder) -> None:
    """Another run takes the lock over as a newcomer does: its record replaces LOCK in one rename,
    so a heartbeat never reads a half-written one (that case has its own test)."""
    write_atomic(run_dir / LOCK_NAME, holder.to_bytes(), durable=False)


@contextmanager
def beating(path: Path, holder: Holder) -> Iterator[Heartbeat]:
    """The planted holder is alive: its heartbeat touches the lock every `holder.every` seconds."""
    with Heartbeat(Lock(path, holder, owned=True), every=holder.every) as beat:
        yield beat


def gone_launcher() -> Started:
    """A launcher's record whose process is gone: pid 1 with a start time not its own (the pid
    since given to another process)."""
    return Started(1, (process_start(1) or 0) + 1)
