"""One live run per run directory: `<run dir>/LOCK`, safe on a shared filesystem.

NFS gives no flock that holds across hosts, so the lock is a file. It is written whole under a
unique name and hard-linked to LOCK, which is atomic on local filesystems and NFS alike: exactly
one of two runs creates it, and nobody ever reads a half-written one. The holder touches it
every HEARTBEAT_SECONDS. Another run takes it over only when

- it is the same job (same owner: a requeued SLURM attempt, a replaced pod of the PyTorchJob),
- the holder is provably gone (its process, on this machine, is not running), or
- its heartbeat is older than the stale limit (DIST_JOBS_LOCK_STALE_SECONDS, default 90 s),
  measured against the file server's clock (the mtime of a file we just wrote), not ours.
  Holders beat every DIST_JOBS_LOCK_HEARTBEAT_SECONDS (default 10 s).

Otherwise it is refused with LockHeld (exit 2) naming the holder. Breaking a stale lock goes
through a second lock file, so two newcomers cannot both break it and both believe they hold it.
Stdlib only: the batch script, the pod entrypoint, the local launcher and the trainer share it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from dist_jobs.errors import BackendError, UsageError
from dist_jobs.rundir.holder import Holder

LOCK_NAME = "LOCK"
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 90.0
_BREAK_STALE_SECONDS = 30.0  # a breaker that died half-way is ignored after this
_ATTEMPTS = 50
_SETTLE_SECONDS = 1.0  # how long a heartbeat waits for a half-written record before calling the lock lost


class LockHeld(UsageError):
    """The run directory belongs to another live run."""

    def __init__(self, path: Path, holder: Holder | None, age: float, stale_after: float) -> None:
        who = holder.describe() if holder else "a holder whose record cannot be read"
        stop = holder.stop_hint() if holder else f"find the run that uses {path.parent}"
        super().__init__(
            f"run directory {path.parent} is in use by another run ({who}; "
            f"last heartbeat {age:.0f} s ago): refusing to start a second run in it",
            hint=f"wait for that run to end or stop it ({stop}), or give this run another name or "
            f"checkpoint_dir. A holder whose heartbeat stops is taken over after {stale_after:.0f} s; "
            f"delete {path} only if you are sure that run is gone",
        )
        self.holder = holder
        self.age = age


def _seconds(name: str, default: float, environ: Mapping[str, str] | None) -> float:
    env = os.environ if environ is None else environ
    try:
        return max(0.05, float(env.get(name, default)))
    except ValueError:
        return default


def stale_seconds(environ: Mapping[str, str] | None = None) -> float:
    return _seconds("DIST_JOBS_LOCK_STALE_SECONDS", STALE_SECONDS, environ)


def heartbeat_seconds(environ: Mapping[str, str] | None = None) -> float:
    return _seconds("DIST_JOBS_LOCK_HEARTBEAT_SECONDS", HEARTBEAT_SECONDS, environ)


def new_token() -> str:
    return uuid.uuid4().hex


def _write_new(path: Path, data: bytes) -> bool:
    """Create `path` holding `data` unless it exists; the content appears all at once."""
    tmp = path.with_name(f".{path.name}.{new_token()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        # NFS: a retransmitted LINK can report failure after it succeeded; the count tells.
        # A filesystem without hard links gets O_EXCL instead (content then shows a moment later).
        with contextlib.suppress(OSError):
            if os.stat(tmp).st_nlink == 2:
                return True
        return _create_exclusive(path, data)
    finally:
        tmp.unlink(missing_ok=True)


def _create_exclusive(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def age(path: Path) -> float | None:
    """Seconds since `path` was last touched, by the clock of the filesystem that holds it."""
    probe = path.with_name(f".{path.name}.{new_token()}.now")
    try:
        probe.touch()
        now = probe.stat().st_mtime
        probe.unlink()
        return max(0.0, now - path.stat().st_mtime)
    except FileNotFoundError:
        return None


def _break(path: Path, judged: bytes) -> bool:
    """Remove the stale lock we judged, unless it changed meanwhile; one breaker at a time."""
    breaker = path.with_name(path.name + ".break")
    if not _write_new(breaker, b""):
        old = age(breaker)
        if old is not None and old > _BREAK_STALE_SECONDS:
            breaker.unlink(missing_ok=True)
        return False
    try:
        if _read(path) != judged:
            return False
        path.unlink()
        return True
    finally:
        breaker.unlink(missing_ok=True)


def takeover_reason(holder: Holder | None, me: Holder, held_for: float, stale_after: float) -> str | None:
    """Why `me` may take the lock from `holder`, or None when `holder` must be presumed alive."""
    if holder is not None and holder.owner and holder.owner == me.owner:
        return f"an earlier attempt of the same job ({holder.owner}) held it"
    if holder is not None and holder.gone():
        return f"its holder ({holder.describe()}) is not running any more"
    if held_for > stale_after:
        return f"its holder's last heartbeat was {held_for:.0f} s ago (stale after {stale_after:.0f} s)"
    return None


@dataclass
class Lock:
    path: Path
    holder: Holder
    owned: bool  # False: joined a lock our launcher holds (it beats and releases, not us)
    took_over: str | None = None  # why an earlier holder's lock was taken over
    successor: Holder | None = None  # after a failed beat(): who holds it now (None: nobody readable)

    @property
    def token(self) -> str:
        return self.holder.token

    def beat(self) -> bool:
        """Touch the lock if it is still ours; False once it is not (released or taken over),
        with `successor` naming who holds it now."""
        self.successor = self.current(settle=_SETTLE_SECONDS)
        if self.successor != self.holder:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path)
            return True
        self.successor = None  # removed between our look and our touch
        return False

    def release(self) -> None:
        if self.owned and Holder.parse(_read(self.path) or b"") == self.holder:
            self.path.unlink(missing_ok=True)

    def current(self, settle: float = 0.0) -> Holder | None:
        """The holder the lock file names; None for no file or a record that cannot be read.
        With `settle`, a missing or unreadable record is looked at again for that many seconds:
        a takeover removes the file a moment before its successor's appears, and a writer
        without hard links (or a person's editor) fills the file after creating it."""
        deadline = time.monotonic() + settle
        while True:
            raw = _read(self.path)
            holder = None if raw is None else Holder.parse(raw)
            if holder is not None or time.monotonic() >= deadline:
                return holder
            time.sleep(0.05)


def acquire(run_dir: Path, me: Holder, inherited: str = "", stale_after: float | None = None) -> Lock:
    """Take `run_dir`'s lock for `me`, or join it when it holds the `inherited` token (exported
    as DIST_JOBS_LOCK_TOKEN by the launcher that took it). Raises LockHeld when another live
    run holds it."""
    try:
        return _acquire(run_dir, me, inherited, stale_seconds() if stale_after is None else stale_after)
    except OSError as exc:
        raise BackendError(
            f"cannot lock the run directory {run_dir}: {exc.strerror or exc}",
            "check that checkpoint_dir exists on a writable (shared) filesystem",
        ) from exc


def _acquire(run_dir: Path, me: Holder, inherited: str, stale_after: float) -> Lock:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    took_over: str | None = None
    for _ in range(_ATTEMPTS):
        if _write_new(path, me.to_bytes()):
            return Lock(path, me, owned=True, took_over=took_over)
        raw = _read(path)
        if raw is None:
            continue  # released between our two looks
        holder = Holder.parse(raw)
        if holder is not None and inherited and holder.token == inherited:
            return Lock(path, holder, owned=False)
        held_for = age(path)
        if held_for is None:
            continue
        if holder is None and held_for < 5.0:  # being written without link(): give it a moment
            time.sleep(0.1)
            continue
        reason = takeover_reason(holder, me, held_for, stale_after)
        if reason is None:
            raise LockHeld(path, holder, held_for, stale_after)
        took_over = reason
        if not _break(path, raw):
            time.sleep(0.05)
    raise BackendError(
        f"could not take the lock {path}: it kept changing hands",
        "another run is starting in the same run directory right now; try again in a minute",
    )


class Heartbeat:
    """Touches a lock every `every` seconds (default: heartbeat_seconds()) from a daemon thread;
    `on_lost` runs once if the lock stops being ours (another run took it over: we looked dead)."""

    def __init__(
        self, lock: Lock, every: float | None = None, on_lost: Callable[[Holder | None], None] | None = None
    ) -> None:
        self.lock = lock
        self.every = heartbeat_seconds() if every is None else every
        self.on_lost = on_lost
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dist-jobs-lock-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            if not self.lock.beat():
                self.lost = True
                if self.on_lost is not None:
                    self.on_lost(self.lock.successor)
                return

    def __enter__(self) -> Heartbeat:
        if self.lock.owned:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)


@contextlib.contextmanager
def held(
    run_dir: Path, me: Holder, inherited: str = "", on_lost: Callable[[Holder | None], None] | None = None
) -> Iterator[Lock]:
    """The lock for the duration of the block: taken (or joined), kept beating, released."""
    lock = acquire(run_dir, me, inherited)
    try:
        with Heartbeat(lock, on_lost=on_lost):
            yield lock
    finally:
        lock.release()
