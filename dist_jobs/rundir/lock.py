"""One live run per run directory: `<run dir>/LOCK`, safe on a shared filesystem.

NFS gives no flock that holds across hosts, so the lock is a file. It is written whole under a
unique name and hard-linked to LOCK, which is atomic on local filesystems and NFS alike: exactly
one of two runs creates it, and nobody ever reads a half-written one. The holder touches it
every heartbeat (DIST_JOBS_LOCK_HEARTBEAT_SECONDS, default 10 s; the record says how often), which
must be at most a third of the stale limit below (else the run is refused, exit 2).

A newcomer takes it over at once when the holder is provably gone (its process, on this machine,
is not running). A holder on this machine whose process runs is refused at once (LockHeld,
exit 2). Any other holder is watched: a heartbeat seen to beat means a live run (refused), even
one of the same job or one squeue calls ended (an old attempt whose node dropped out of SLURM
while its processes live on still writes). Two verdicts shorten the wait once no beat came for
two of the holder's heartbeat periods: the same owner (a requeued SLURM attempt, a replaced pod of
the PyTorchJob) and the holder's SLURM job ended or waiting in the queue (asked of squeue, same
cluster only). Otherwise a holder that stops beating is taken over once the newcomer has watched it
for the stale limit (DIST_JOBS_LOCK_STALE_SECONDS, default 90 s, and at least three of the
holder's heartbeat periods) without seeing a beat. That is judged on the newcomer's own
monotonic clock, by watching the file's mtime change, never by comparing that mtime with a
clock: on Lustre, CephFS or GPFS the holder's client clock writes it. Breaking a
stale lock renames the newcomer's record over it, so LOCK is never missing; one newcomer at a
time breaks a given record (an exclusive guard file that only its creator removes), and only
while LOCK is still the very file it judged. The record names the attempt of its job: when a
newer attempt took the lock, an older attempt's heartbeat leaves the job's steps alone (they
are the newer attempt's) and its ranks stop at their next fence.

A holder retries a transient I/O error on LOCK (EIO, ESTALE, ...) within its lease, a beat short
of the stale limit, and then stops itself as if the lock were lost: past that a newcomer may
take it. A heartbeat that fails in any way is a lost lease too (the heartbeat thread and held(),
the lock kept for a block, are dist_jobs.rundir.lease's).

A holder that was only paused (SIGSTOP, a suspended SLURM job, an NFS failover) may wake up
after losing its lock. `Fence.check()` is how it learns before every write into the run
directory: LockLost (exit 6) names the new holder, and the run writes nothing more. A write
that passed its fence and stalled lands where the new holder never looks: a checkpoint is staged
under the holder's `Fence.stamp`, and committed only where no step is committed yet. Processes
that hold no lock themselves (a PyTorchJob's worker pods) follow the holder's: `lockctl follow`
stops them once another job holds it. Stdlib only: the batch script, the pod entrypoint, the
local launcher and the trainer share it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from dist_jobs.constants import LOCK_LOST_EXIT_CODE
from dist_jobs.envnum import env_seconds
from dist_jobs.errors import BackendError, DistJobsError, UsageError
from dist_jobs.rundir.atomic import write_new
from dist_jobs.rundir.history import TOOK_OVER, append_history
from dist_jobs.rundir.holder import Holder, heartbeat_seconds
from dist_jobs.rundir.takeover import Seen, Watch, break_stale, look, takeover_reason

_T = TypeVar("_T")

__all__ = [
    "Fence",
    "Lock",
    "LockHeld",
    "LockLost",
    "acquire",
    "check_knobs",
    "check_timings",
    "heartbeat_seconds",
    "retrying",
    "stamp_of",
]

LOCK_NAME = "LOCK"
STALE_SECONDS = 90.0
_ATTEMPTS = 50  # lost races (the lock changed hands under us) before giving up
_SETTLE_SECONDS = 1.0  # how long a heartbeat waits for a half-written record before calling the lock lost
# What a network filesystem answers for a moment (a server failover, a file handle the client
# renews at its next lookup): retried within the lease, not taken as the lock's end.
_TRANSIENT = frozenset({errno.EIO, errno.ESTALE, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT})


class LockHeld(UsageError):
    """The run directory belongs to another live run."""

    def __init__(self, path: Path, holder: Holder | None, age: float, stale_after: float) -> None:
        who = holder.describe() if holder else "a holder whose record cannot be read"
        stop = holder.stop_hint() if holder else f"find the run that uses {path.parent}"
        super().__init__(
            f"run directory {path.parent} is in use by another run ({who}; "
            f"heartbeat seen {age:.0f} s ago): refusing to start a second run in it",
            hint=f"wait for that run to end or stop it ({stop}), or give this run another name or "
            f"checkpoint_dir. A holder whose heartbeat stops is taken over {stale_after:.0f} s after its last beat; "
            f"delete {path} only if you are sure that run is gone",
        )
        self.holder = holder
        self.age = age


class LockLost(DistJobsError):
    """This run's lock now belongs to another run: it must write nothing more in the run directory."""

    exit_code = LOCK_LOST_EXIT_CODE

    def __init__(self, run_dir: Path, successor: Holder | None, doing: str) -> None:
        now = successor.describe() if successor else "nobody: the lock file was removed or cannot be read"
        super().__init__(
            f"lost the lock of run directory {run_dir} (it is now held by {now}): not going to {doing}; "
            f"this run stops without writing anything more there (exit {LOCK_LOST_EXIT_CODE}, not requeued)",
            hint="this run was paused or cut off for longer than the stale limit and another run took the "
            "folder over; that run owns it now. Give this run another name if both should run",
        )
        self.successor = successor


def stale_seconds(environ: Mapping[str, str] | None = None) -> float:
    return env_seconds("DIST_JOBS_LOCK_STALE_SECONDS", STALE_SECONDS, environ)


def check_timings(every: float, stale_after: float) -> None:
    """Refuse a heartbeat slower than a third of the stale limit: a holder that misses one beat
    (a slow filesystem, a busy node) would be taken over while it runs."""
    if every <= stale_after / 3:
        return
    raise UsageError(
        f"DIST_JOBS_LOCK_HEARTBEAT_SECONDS={every:g} is more than a third of "
        f"DIST_JOBS_LOCK_STALE_SECONDS={stale_after:g}: a live run that misses one heartbeat would be "
        "taken over by another run",
        hint=f"set DIST_JOBS_LOCK_HEARTBEAT_SECONDS to at most {stale_after / 3:g}, or "
        f"DIST_JOBS_LOCK_STALE_SECONDS to at least {every * 3:g}",
    )


def check_knobs(environ: Mapping[str, str]) -> None:
    """check_timings() of the DIST_JOBS_LOCK_* knobs a job's environment sets: at submit, before
    the job waits in a queue only to be refused at its start."""
    check_timings(heartbeat_seconds(environ), stale_seconds(environ))


def new_token() -> str:
    return uuid.uuid4().hex


def stamp_of(token: str) -> str:
    """The mark of the holder of lock token `token` (Fence.stamp); "" for no token (no lock held)."""
    return hashlib.sha1(token.encode()).hexdigest()[:12] if token else ""


def lease_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long after its last good beat a holder may go on without one: a beat short of the
    stale limit, so it stops itself before a newcomer may take the lock over."""
    return max(0.0, stale_seconds(environ) - heartbeat_seconds(environ))


def retrying(op: Callable[[], _T], until: float) -> _T:
    """`op()`, again after a transient I/O error until monotonic time `until`; then that error."""
    pause = 0.05
    while True:
        try:
            return op()
        except OSError as exc:
            if exc.errno not in _TRANSIENT or time.monotonic() + pause > until:
                raise
        time.sleep(pause)
        pause = min(1.0, pause * 2)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def current(path: Path, settle: float = 0.0) -> Holder | None:
    """The holder the lock file names; None for no file or a record that cannot be read.
    With `settle`, a missing or unreadable record is looked at again for that many seconds:
    a writer without hard links (or a person's editor) fills the file after creating it."""
    deadline = time.monotonic() + settle
    while True:
        raw = _read(path)
        holder = None if raw is None else Holder.parse(raw)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)


@dataclass
class Lock:
    path: Path
    holder: Holder
    owned: bool  # False: joined a lock our launcher holds (it beats and releases, not us)
    took_over: str | None = None  # why an earlier holder's lock was taken over
    successor: Holder | None = None  # after a failed beat(): who holds it now (None: nobody readable)
    lease: float = field(default_factory=lease_seconds)  # see lease_seconds()
    failure: str = ""  # after a failed beat(): the I/O error that outlasted the lease, if that ended it
    _good: float = field(default_factory=time.monotonic, init=False, repr=False)  # the last good beat
    _mtime: float | None = field(default=None, init=False, repr=False)  # a joined lock's, last seen
    _moved: float = field(default_factory=time.monotonic, init=False, repr=False)  # when it last changed

    @property
    def token(self) -> str:
        return self.holder.token

    def beat(self, touch: bool = True) -> bool:
        """Touch the lock if it is still ours (with touch=False: only look); False once it is not
        (released or taken over), with `successor` naming who holds it now. A transient I/O error
        is retried until the lease ends; then the lock counts as lost (`failure` says why): past
        that, a newcomer may take it over, and this run must not write beside it."""
        try:
            ours = retrying(lambda: self._beat(touch), self._good + self.lease)
        except OSError as exc:
            self.successor = None
            self.failure = f"cannot reach the lock file for {time.monotonic() - self._good:.0f} s: {exc}"
            return False
        if ours:
            self._good = time.monotonic()
        return ours

    def _beat(self, touch: bool) -> bool:
        self.successor = self.current(settle=_SETTLE_SECONDS)
        if self.successor != self.holder:
            return False
        if not touch:
            return self._launcher_beats(os.stat(self.path).st_mtime)
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path)
            return True
        self.successor = None  # removed between our look and our touch
        return False

    def _launcher_beats(self, mtime: float) -> bool:
        """A joined lock: whether the launcher that holds it still beats it (a change of its mtime
        seen within the lease, by our clock). A launcher's heartbeat that ended unexpectedly (killed,
        out of memory) is a lost lease: past it a newcomer may take the lock over."""
        now = time.monotonic()
        if mtime != self._mtime:
            self._mtime, self._moved = mtime, now
        if now - self._moved <= self.lease:
            return True
        self.successor = None
        self.failure = f"the lock's heartbeat stopped: no beat seen for {now - self._moved:.0f} s"
        return False

    def release(self) -> None:
        if self.owned and Holder.parse(_read(self.path) or b"") == self.holder:
            self.path.unlink(missing_ok=True)

    def current(self, settle: float = 0.0) -> Holder | None:
        return current(self.path, settle)

    def fence(self) -> Fence:
        return Fence(self.path, self.token)


@dataclass(frozen=True)
class Fence:
    """Checks, right before a write into the run directory, that this run still holds its lock.
    Every rank can hold one (the token is all it needs): one small read per write."""

    path: Path
    token: str

    @property
    def stamp(self) -> str:
        """This holder's mark on what it stages in the run directory (a checkpoint's partial
        folder) and on every record it writes there (dist_jobs.rundir.stamps): a successor's never
        reads a late write of ours. Filename-safe, whatever the token."""
        return stamp_of(self.token)

    def check(self, doing: str) -> None:
        """Raise LockLost unless the lock file still names our token; `doing` says what we were
        about to do, for the message ("commit checkpoint step-40"). A transient I/O error is
        retried for as long as the holder's heartbeat would retry it; past that it counts as lost."""
        try:
            holder = retrying(lambda: current(self.path), time.monotonic() + lease_seconds())
            if holder is not None and holder.token == self.token:
                return
            successor = holder or current(self.path, settle=_SETTLE_SECONDS)
        except OSError as exc:
            raise LockLost(self.path.parent, None, doing) from exc
        raise LockLost(self.path.parent, successor, doing)


def acquire(
    run_dir: Path,
    me: Holder,
    inherited: str = "",
    stale_after: float | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Lock:
    """Take `run_dir`'s lock for `me`, or join it when it holds the `inherited` token (exported
    as DIST_JOBS_LOCK_TOKEN by the launcher that took it). A holder that may be alive is watched
    (`on_wait` hears why once); raises LockHeld when it is seen alive."""
    stale = stale_seconds() if stale_after is None else stale_after
    check_timings(me.every, stale)
    try:
        return _acquire(run_dir, me, inherited, stale, on_wait)
    except OSError as exc:
        raise BackendError(
            f"cannot lock the run directory {run_dir}: {exc.strerror or exc}",
            "check that checkpoint_dir exists on a writable (shared) filesystem",
        ) from exc


def _acquire(
    run_dir: Path, me: Holder, inherited: str, stale_after: float, on_wait: Callable[[str], None] | None
) -> Lock:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    watch: Watch | None = None
    races = 0
    while races < _ATTEMPTS:
        if write_new(path, me.to_bytes()):
            return Lock(path, me, owned=True, lease=max(0.0, stale_after - me.every))
        seen = look(path)
        if seen is None:
            races += 1  # released between our two looks
            continue
        if seen.holder is not None and inherited and seen.holder.token == inherited:
            return Lock(path, seen.holder, owned=False)
        if watch is None or not watch.same_holder(seen):
            watch = Watch(seen)  # a new holder (or the first look): watch it afresh
        reason = _verdict(seen, watch, me, stale_after, on_wait, path)
        broke = None if reason is None else break_stale(path, seen, me.to_bytes(), watch.guards)
        if broke:
            _retire(run_dir, seen.holder, me)
            return Lock(path, me, owned=True, took_over=reason, lease=max(0.0, stale_after - me.every))
        if broke is None:
            time.sleep(_poll_seconds(seen.holder))
        else:
            races += 1
            time.sleep(0.05)
    raise BackendError(
        f"could not take the lock {path}: it kept changing hands",
        "another run is starting in the same run directory right now; try again in a minute",
    )


def _retire(run_dir: Path, predecessor: Holder | None, me: Holder) -> None:
    """The takeover row, appended the moment the lock is ours: it retires the predecessor's stamp
    in metrics.jsonl, so whatever it lands late is not believed (dist_jobs.rundir.stamps), also
    when this holder logs nothing before it ends."""
    before = "" if predecessor is None else stamp_of(predecessor.token)
    append_history(run_dir, {TOOK_OVER: before, "stamp": stamp_of(me.token), "time": time.time()})


def _verdict(
    seen: Seen, watch: Watch, me: Holder, stale_after: float, on_wait: Callable[[str], None] | None, path: Path
) -> str | None:
    """Why the lock may be taken now; None to keep watching; raises LockHeld for a live holder.
    Staleness is what we watch on our own clock (no beat seen for so long), not the file's mtime
    against a clock: on Lustre, CephFS or GPFS the holder's client clock writes that mtime."""
    holder, now = seen.holder, time.monotonic()
    watch.saw(seen, now)
    quiet = watch.quiet(now)
    reason = takeover_reason(holder, quiet, stale_after) or watch.verdict_without_beat(holder, me, now)
    if reason is not None:
        return reason
    if watch.beats or (holder is not None and holder.on_this_machine()):
        raise LockHeld(path, holder, quiet, stale_after)  # it beats, or its process runs here
    if on_wait is not None and not watch.told:
        watch.told = True
        on_wait(
            f"waiting for the lock of {path.parent}: its holder "
            f"({holder.describe() if holder else 'a record that cannot be read'}) is not seen to beat; "
            f"refused if it beats again, taken over once no beat came for {stale_after:.0f} s"
        )
    return None


def _poll_seconds(holder: Holder | None) -> float:
    """A quarter of the holder's heartbeat period (at most a second): a beat is not missed."""
    return min(1.0, max(0.02, (holder.every if holder else 1.0) / 4))
