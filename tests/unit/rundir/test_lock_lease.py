"""The lock's lease: what a holder does when the filesystem fails it for a moment or for good, and
the knobs that size it. Filesystem errors are injected into the lock module's one reader."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.constants import LOCK_LOST_EXIT_CODE
from dist_jobs.rundir import lock as lockmod
from dist_jobs.rundir import lockctl, takeover
from dist_jobs.rundir.history import HISTORY
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lease import Heartbeat
from dist_jobs.rundir.lock import LOCK_NAME, Lock, LockHeld, LockLost, acquire, new_token
from support.lock_support import beating, plant, take_over

Reader = Callable[[Path], "bytes | None"]


def me(every: float = 0.05) -> Holder:
    return Holder.this(new_token(), "slurm:77", "slurm", "77", every=every)


def failing_reads(monkeypatch: pytest.MonkeyPatch, times: int, code: int = errno.EIO) -> list[int]:
    """The next `times` reads of the lock file fail with `code` (-1: for ever); counts the failures."""
    real: Reader = lockmod._read
    failed: list[int] = []

    def read(path: Path) -> bytes | None:
        if times < 0 or len(failed) < times:
            failed.append(code)
            raise OSError(code, os.strerror(code), str(path))
        return real(path)

    monkeypatch.setattr(lockmod, "_read", read)
    return failed


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE])
def test_a_transient_io_error_is_retried_and_the_lock_stays_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    lock = acquire(tmp_path / "run", me(), stale_after=30)
    failed = failing_reads(monkeypatch, 3, code)
    assert lock.beat() and lock.failure == ""
    assert len(failed) == 3
    failing_reads(monkeypatch, 2, code)
    lock.fence().check("write progress.json")  # a progress write goes on too


def test_an_io_error_that_outlasts_the_lease_loses_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = acquire(tmp_path / "run", me(), stale_after=0.6)
    assert lock.lease == pytest.approx(0.55)
    failing_reads(monkeypatch, -1)
    assert not lock.beat()
    assert lock.successor is None and "cannot reach the lock file" in lock.failure and "Input/output" in lock.failure


def test_a_fence_that_cannot_read_the_lock_within_the_lease_says_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIST_JOBS_LOCK_STALE_SECONDS", "0.6")
    monkeypatch.setenv("DIST_JOBS_LOCK_HEARTBEAT_SECONDS", "0.1")
    lock = acquire(tmp_path / "run", me(0.1))
    failing_reads(monkeypatch, -1)
    with pytest.raises(LockLost, match="not going to commit checkpoint step-5"):
        lock.fence().check("commit checkpoint step-5")


def test_a_heartbeat_thread_that_fails_reports_the_lease_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = acquire(tmp_path / "run", me(), stale_after=30)

    def broken(path: Path) -> bytes | None:
        raise RuntimeError("a bug in the heartbeat")

    lost: list[Holder | None] = []
    monkeypatch.setattr(lockmod, "_read", broken)
    with Heartbeat(lock, on_lost=lost.append) as beat:
        assert beat.lost.wait(10)
    assert lost == [None] and "a bug in the heartbeat" in lock.failure


def run_heartbeat(monkeypatch: pytest.MonkeyPatch, run_dir: Path, lock: Lock) -> tuple[int, list[str]]:
    """`lockctl heartbeat` in this process (so the fault can be injected), its stop-steps stubbed."""
    stopped: list[str] = []
    monkeypatch.setattr(lockctl, "_stop_slurm_steps", stopped.append)
    monkeypatch.setattr(lockctl.signal, "signal", lambda *_: signal.SIG_DFL)  # keep pytest's own handlers
    argv = ["heartbeat", str(run_dir), lock.token, "--every", "0.05", "--pid", str(os.getpid()), "--stop-steps", "77"]
    return lockctl.main(argv), stopped


def test_lockctl_heartbeat_rides_out_a_transient_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIST_JOBS_LOCK_STALE_SECONDS", "30")
    lock = acquire(tmp_path / "run", me(), stale_after=30)
    failing_reads(monkeypatch, 4)
    releaser = threading.Timer(1.0, lock.path.unlink)  # the job ends a while after the error
    releaser.start()
    try:
        code, stopped = run_heartbeat(monkeypatch, tmp_path / "run", lock)
    finally:
        releaser.join()
    assert code == 0 and stopped == []


def test_lockctl_heartbeat_stops_the_job_once_the_error_outlasts_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DIST_JOBS_LOCK_STALE_SECONDS", "0.6")
    monkeypatch.setenv("DIST_JOBS_LOCK_HEARTBEAT_SECONDS", "0.1")
    lock = acquire(tmp_path / "run", me(0.1))
    failing_reads(monkeypatch, -1)
    code, stopped = run_heartbeat(monkeypatch, tmp_path / "run", lock)
    assert code == LOCK_LOST_EXIT_CODE and stopped == ["77"]
    err = capsys.readouterr().err
    assert "lost the lock of run directory" in err and "Input/output error" in err


def test_lockctl_heartbeat_that_fails_stops_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = acquire(tmp_path / "run", me(), stale_after=30)

    def broken(path: Path) -> bytes | None:
        raise RuntimeError("a bug in the heartbeat")

    monkeypatch.setattr(lockmod, "_read", broken)
    code, stopped = run_heartbeat(monkeypatch, tmp_path / "run", lock)
    assert code == LOCK_LOST_EXIT_CODE and stopped == ["77"]
    assert "a bug in the heartbeat" in capsys.readouterr().err


def stale_lock(run_dir: Path) -> Path:
    """A lock whose holder on another host stopped beating a minute past the stale limit."""
    run_dir.mkdir(parents=True)
    path = run_dir / LOCK_NAME
    path.write_bytes(dataclasses.replace(me(), host="n9", boot_id="other-boot").to_bytes())
    then = time.time() - lockmod.stale_seconds() - 60
    os.utime(path, (then, then))
    return path


def test_breaking_a_stale_lock_leaves_no_moment_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file operation of the break sees LOCK there, before and after: a newcomer arriving
    in between can never create a second one, and no holder's fence reads "removed"."""
    path = stale_lock(tmp_path / "run")
    missing: list[str] = []

    def watched(name: str) -> Callable[..., Any]:
        real = getattr(os, name)

        def op(*args: Any, **kwargs: Any) -> Any:
            if not os.path.exists(path):
                missing.append(f"before {name}{args}")
            try:
                return real(*args, **kwargs)
            finally:
                if not os.path.exists(path):
                    missing.append(f"after {name}{args}")

        return op

    for name in ("rename", "link", "unlink", "replace"):
        monkeypatch.setattr(lockmod.os, name, watched(name))
    lock = acquire(tmp_path / "run", me(), stale_after=0.5)
    assert lock.took_over and Holder.parse(path.read_bytes()) == lock.holder
    assert missing == []
    # no guard or aside copy left behind: the lock, and metrics.jsonl with the takeover row alone
    assert sorted(p.name for p in path.parent.iterdir()) == [LOCK_NAME, HISTORY]


def test_another_breakers_guard_is_waited_for_and_never_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = stale_lock(tmp_path / "run")
    judged = takeover.look(path)
    assert judged is not None
    guards: dict[str, float] = {}
    assert takeover.claim_guard(path, judged, guards) is not None  # another newcomer's, then it died
    (theirs,) = path.parent.glob(".LOCK.breaking.*")
    clock = [1000.0]
    monkeypatch.setattr(takeover.time, "monotonic", lambda: clock[0])
    assert takeover.break_stale(path, judged, me().to_bytes(), guards) is None  # busy: wait
    clock[0] += takeover.BREAK_ABANDONED_S + 1  # unchanged that long on our own clock: its breaker died
    mine = me()
    assert takeover.break_stale(path, judged, mine.to_bytes(), guards) is True
    assert Holder.parse(path.read_bytes()) == mine
    assert theirs.exists()  # left to its owner: only our own guard is removed
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([LOCK_NAME, theirs.name])


def test_a_late_breaker_never_makes_the_rightful_holders_fence_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B judged the stale lock; A took it over first. While B looks at the lock and gives up,
    A's fence passes at every step of B's."""
    path = stale_lock(tmp_path / "run")
    judged = takeover.look(path)
    assert judged is not None
    first = acquire(tmp_path / "run", me(), stale_after=0.5)
    fence = first.fence()
    failures: list[str] = []

    def checked(name: str) -> Callable[..., Any]:
        real = getattr(os, name)

        def op(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            try:
                fence.check("write a checkpoint")
            except LockLost as exc:
                failures.append(f"after {name}: {exc}")
            return result

        return op

    for name in ("rename", "link", "unlink"):
        monkeypatch.setattr(lockmod.os, name, checked(name))
    assert takeover.break_stale(path, judged, me().to_bytes(), {}) is False
    assert failures == [] and Holder.parse(path.read_bytes()) == first.holder


def remote(owner: str = "slurm:77", every: float = 0.1) -> Holder:
    """A holder on another host: only its heartbeat says whether it lives."""
    holder = Holder.this(new_token(), owner, "slurm", owner.rpartition(":")[2], every=every)
    return dataclasses.replace(holder, host="n9", pid=4321, boot_id="other-boot")


@pytest.mark.parametrize("why", ["same job", "squeue says pending"])
def test_a_verdict_never_takes_a_lock_that_beats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """An old attempt whose node dropped out of SLURM while its processes live on: SLURM calls the
    job pending (requeued) and the new attempt is the same job, but the lock beats: a live run."""
    monkeypatch.setattr(Holder, "job_ended", lambda self: "PENDING")
    old = remote("slurm:77" if why == "same job" else "slurm:76")
    path = plant(tmp_path / "run", old)
    with beating(path, old), pytest.raises(LockHeld):
        acquire(tmp_path / "run", me(), stale_after=30)
    assert Holder.parse(path.read_bytes()) == old


@pytest.mark.parametrize("why", ["same job", "squeue says pending"])
def test_a_verdict_shortens_the_wait_once_no_beat_came_for_two_periods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    monkeypatch.setattr(Holder, "job_ended", lambda self: "PENDING")
    old = remote("slurm:77" if why == "same job" else "slurm:76", every=0.3)
    plant(tmp_path / "run", old)
    started = time.monotonic()
    lock = acquire(tmp_path / "run", me(), stale_after=30)
    assert 0.6 <= time.monotonic() - started < 20  # two periods, not the stale limit
    expected = "an earlier attempt of the same job" if why == "same job" else "SLURM job 76 is pending"
    assert expected in (lock.took_over or "")


def test_the_holder_record_names_its_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    holder = Holder.this(new_token(), "slurm:77", "slurm", "77")
    assert holder.attempt == "2" and "slurm job 77 (attempt 2)" in holder.describe()
    assert Holder.parse(holder.to_bytes()) == holder
    newer = {**json.loads(holder.to_bytes()), "a_later_field": 1}
    assert Holder.parse(json.dumps(newer).encode()) == holder  # a later version's record still reads


@pytest.mark.parametrize("successor", ["newer attempt", "another job"])
def test_an_old_attempts_heartbeat_leaves_the_new_attempts_steps_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], successor: str
) -> None:
    lock = acquire(tmp_path / "run", me(), stale_after=30)
    if successor == "newer attempt":
        thief = dataclasses.replace(lock.holder, token=new_token(), attempt="1", host="n2")
    else:
        thief = remote("slurm:78")
    threading.Timer(0.3, take_over, (tmp_path / "run", thief)).start()
    code, stopped = run_heartbeat(monkeypatch, tmp_path / "run", lock)
    assert code == LOCK_LOST_EXIT_CODE
    if successor == "newer attempt":
        assert stopped == [] and "(attempt 1), pid" in capsys.readouterr().err
    else:
        assert stopped == ["77"]


def test_a_joined_lock_whose_launcher_stopped_beating_is_a_lost_lease(tmp_path: Path) -> None:
    """The batch script's heartbeat process was killed (out of memory, SIGKILL): nothing beats the
    lock any more, and a newcomer will take it. The trainer that joined it stops first."""
    outer = acquire(tmp_path / "run", me(), stale_after=30)
    inner = Lock(outer.path, outer.holder, owned=False, lease=0.5)
    lost: list[Holder | None] = []
    with beating(outer.path, outer.holder), Heartbeat(inner, every=0.05, on_lost=lost.append) as watch:
        assert not watch.lost.wait(1.0)  # beaten by its launcher: ours
    with Heartbeat(inner, every=0.05, on_lost=lost.append) as watch:
        assert watch.lost.wait(10)  # the launcher's heartbeat ended
    assert lost == [None] and "the lock's heartbeat stopped: no beat seen for" in inner.failure
