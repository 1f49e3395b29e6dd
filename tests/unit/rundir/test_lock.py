"""The run directory lock (dist_jobs/rundir): who may take it, who is refused, and with what words.

Holders on "another host" are played by records whose host name is not this one, so that only
their heartbeat can tell whether they live; holders on this machine are real processes.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.constants import LOCK_LOST_EXIT_CODE
from dist_jobs.errors import UsageError
from dist_jobs.rundir import lock as lockmod
from dist_jobs.rundir import takeover
from dist_jobs.rundir.holder import Holder, owner_from_env, process_start
from dist_jobs.rundir.lease import Heartbeat, held
from dist_jobs.rundir.lock import (
    LOCK_NAME,
    LockHeld,
    LockLost,
    acquire,
    new_token,
    stale_seconds,
)
from support.lock_support import beating
from support.paths import PYTHON, REPO
from support.waiting import HUNG_S, eventually

LOCKCTL = [PYTHON, "-m", "dist_jobs.rundir.lockctl"]


def me(owner: str = "", backend: str = "local", job_id: str = "", every: float | None = None) -> Holder:
    return Holder.this(new_token(), owner, backend, job_id, every=every)


def elsewhere(owner: str = "slurm:77", job_id: str = "77", every: float = 0.05) -> Holder:
    """A holder on another host: nothing here can see whether its process runs, only its heartbeat."""
    return dataclasses.replace(me(owner, "slurm", job_id), host="n9", pid=4321, boot_id="other-boot", every=every)


def plant(run_dir: Path, holder: Holder, age: float = 0.0) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    path.write_bytes(holder.to_bytes())
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_the_lock_file_names_its_holder_and_goes_at_release(tmp_path: Path) -> None:
    holder = me("slurm:123", "slurm", "123")
    lock = acquire(tmp_path / "run", holder)
    record = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
    assert record["host"] == socket.gethostname() and record["pid"] == os.getpid() and record["job_id"] == "123"
    assert record["token"] == lock.token and lock.owned and lock.took_over is None
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_NAME]  # no temporary files left
    lock.release()
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_a_second_run_is_refused_with_the_holder_and_the_fix(tmp_path: Path) -> None:
    holder = elsewhere()
    path = plant(tmp_path / "run", holder, age=3)
    with beating(path, holder), pytest.raises(LockHeld) as caught:
        acquire(tmp_path / "run", me("slurm:78", "slurm", "78"))
    error = caught.value
    assert error.exit_code == 2 and error.holder == holder
    text = str(error)
    assert f"run directory {tmp_path / 'run'} is in use by another run (slurm job 77, pid 4321 on host n9" in text
    assert "heartbeat seen 0 s ago" in text
    assert "hint: wait for that run to end or stop it (scancel 77)" in text and str(path) in text


def test_the_refusal_leaves_the_holders_lock_as_it_was(tmp_path: Path) -> None:
    holder = elsewhere()
    path = plant(tmp_path / "run", holder, age=3)
    with beating(path, holder), pytest.raises(LockHeld):
        acquire(tmp_path / "run", me())
    assert Holder.parse(path.read_bytes()) == holder
    assert sorted(p.name for p in path.parent.iterdir()) == [LOCK_NAME]


def test_a_requeued_attempt_of_the_same_job_takes_it_over(tmp_path: Path) -> None:
    plant(tmp_path / "run", elsewhere("slurm:77"), age=1)
    lock = acquire(tmp_path / "run", me("slurm:77", "slurm", "77"))
    assert lock.owned and "an earlier attempt of the same job (slurm:77)" in (lock.took_over or "")
    assert Holder.parse((tmp_path / "run" / LOCK_NAME).read_bytes()) == lock.holder


def test_a_stale_heartbeat_is_taken_over_a_beating_one_is_not(tmp_path: Path) -> None:
    holder = elsewhere()
    path = plant(tmp_path / "run", holder, age=stale_seconds() - 20)
    with beating(path, holder), pytest.raises(LockHeld):
        acquire(tmp_path / "run", me())
    plant(tmp_path / "run", elsewhere(), age=stale_seconds() + 20)
    lock = acquire(tmp_path / "run", me(every=0.1), stale_after=0.5)
    assert "heartbeat was not seen for" in (lock.took_over or "") and lock.owned


def test_staleness_is_watched_on_our_clock_not_read_from_the_mtime(tmp_path: Path) -> None:
    """On Lustre, CephFS or GPFS the holder's client clock writes the mtime: one far in the past
    (a clock behind) says nothing; a lock is stale only once we watched it not beat that long."""
    plant(tmp_path / "run", elsewhere(every=0.1), age=3600)
    started = time.monotonic()
    lock = acquire(tmp_path / "run", me(every=0.1), stale_after=1.0)
    assert time.monotonic() - started >= 1.0 and lock.owned


@pytest.mark.timeout(60)  # a newcomer that compares the mtime with its clock waits for ever
def test_a_lock_whose_mtime_lies_in_the_future_is_still_taken_once_it_stops_beating(tmp_path: Path) -> None:
    """A holder whose client clock runs ahead: its mtimes are in our future, yet it is stale
    once no beat came for the stale limit."""
    plant(tmp_path / "run", elsewhere(every=0.1), age=-3600)
    lock = acquire(tmp_path / "run", me(every=0.1), stale_after=1.0)
    assert lock.owned and "heartbeat was not seen for 1 s" in (lock.took_over or "")


def test_a_holder_whose_heartbeat_stopped_is_waited_for_then_taken_over(tmp_path: Path) -> None:
    """A job killed a moment ago (scancel, then SIGKILL) left a fresh lock that never beats again:
    the newcomer says it waits, and takes the lock once it is stale instead of refusing at once."""
    plant(tmp_path / "run", elsewhere(every=0.1), age=0)
    said: list[str] = []
    started = time.monotonic()
    lock = acquire(tmp_path / "run", me(every=0.1), stale_after=1.5, on_wait=said.append)
    assert time.monotonic() - started >= 1.0
    assert lock.owned and "heartbeat was not seen for" in (lock.took_over or "")
    assert len(said) == 1
    assert said[0].startswith(f"waiting for the lock of {tmp_path / 'run'}: its holder (slurm job 77")
    assert "refused if it beats again, taken over once no beat came for 2 s" in said[0]


def test_a_waited_for_holder_that_beats_again_is_refused(tmp_path: Path) -> None:
    """A paused holder (SIGSTOP, a suspended job) that wakes up before the stale limit is alive."""
    holder = elsewhere(every=0.1)
    path = plant(tmp_path / "run", holder, age=0)
    waiting = threading.Event()
    outcome: list[BaseException] = []

    def newcomer() -> None:
        try:
            acquire(tmp_path / "run", me(), stale_after=30, on_wait=lambda _: waiting.set())
        except LockHeld as exc:
            outcome.append(exc)

    thread = threading.Thread(target=newcomer)
    thread.start()
    assert waiting.wait(20)
    os.utime(path)  # the holder's heartbeat resumes
    thread.join(20)
    assert not thread.is_alive() and len(outcome) == 1 and outcome[0].holder == holder  # type: ignore[attr-defined]
    assert Holder.parse(path.read_bytes()) == holder


def _fake_squeue(folder: Path, stdout: str, stderr: str, code: int) -> dict[str, str]:
    """squeue as SLURM 22.05 answers `squeue --noheader --jobs ID --format %T` (see fixtures)."""
    folder.mkdir()
    script = folder / "squeue"
    script.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\nexit {code}\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}", "SLURM_CLUSTER_NAME": "distjobs"}


@pytest.mark.parametrize(
    ("stdout", "stderr", "code", "taken"),
    [
        ("", "slurm_load_jobs error: Invalid job id specified\n", 1, "is gone (squeue)"),
        ("CANCELLED\n", "", 0, "is cancelled (squeue)"),
        ("PENDING\n", "", 0, "is pending (squeue)"),
        ("RUNNING\n", "", 0, None),
        ("SUSPENDED\n", "", 0, None),
    ],
    ids=["forgotten", "cancelled", "requeued", "running", "suspended"],
)
def test_a_slurm_holder_is_asked_of_the_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: str, stderr: str, code: int, taken: str | None
) -> None:
    for name, value in _fake_squeue(tmp_path / "bin", stdout, stderr, code).items():
        monkeypatch.setenv(name, value)
    holder = dataclasses.replace(elsewhere(every=0.1), cluster="distjobs")
    path = plant(tmp_path / "run", holder, age=0)
    if taken:
        lock = acquire(tmp_path / "run", me(), stale_after=60)
        assert f"its holder's SLURM job 77 {taken}" == lock.took_over
        return
    with beating(path, holder), pytest.raises(LockHeld):
        acquire(tmp_path / "run", me(), stale_after=60)


def test_another_clusters_job_is_not_asked_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job 77 on another cluster means nothing to this squeue: only the heartbeat can tell."""
    for name, value in _fake_squeue(tmp_path / "bin", "", "Invalid job id specified\n", 1).items():
        monkeypatch.setenv(name, value)
    holder = dataclasses.replace(elsewhere(every=0.1), cluster="other")
    path = plant(tmp_path / "run", holder, age=0)
    with beating(path, holder), pytest.raises(LockHeld):
        acquire(tmp_path / "run", me(), stale_after=60)


def test_an_ambiguous_create_is_checked_not_taken_as_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS: a LINK retransmitted after the first one succeeded answers EEXIST; the file is ours."""
    real_link = os.link

    def link_then_eexist(src: Any, dst: Any) -> None:
        real_link(src, dst)
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(lockmod.os, "link", link_then_eexist)
    lock = acquire(tmp_path / "run", me())
    assert lock.owned and lock.took_over is None
    assert Holder.parse((tmp_path / "run" / LOCK_NAME).read_bytes()) == lock.holder


def test_a_stale_lock_that_beats_before_the_break_is_left_alone(tmp_path: Path) -> None:
    """Judged stale, then it beat: the breaker finds a newer mtime and leaves it in place."""
    holder = elsewhere()
    path = plant(tmp_path / "run", holder, age=stale_seconds() + 20)
    judged = takeover.look(path)
    assert judged is not None
    os.utime(path)  # the holder wakes up between the judgement and the break
    assert takeover.break_stale(path, judged, me().to_bytes(), {}) is False
    assert Holder.parse(path.read_bytes()) == holder and sorted(p.name for p in path.parent.iterdir()) == [LOCK_NAME]


def test_the_fence_passes_while_ours_and_names_the_new_holder_once_lost(tmp_path: Path) -> None:
    lock = acquire(tmp_path / "run", me())
    fence = lock.fence()
    fence.check("commit checkpoint step-5")
    thief = elsewhere()
    plant(tmp_path / "run", thief, age=0)
    with pytest.raises(LockLost) as caught:
        fence.check("commit checkpoint step-10")
    error = caught.value
    assert error.exit_code == LOCK_LOST_EXIT_CODE == 6 and error.successor == thief
    assert str(error).startswith(
        f"lost the lock of run directory {tmp_path / 'run'} (it is now held by slurm job 77, pid 4321 on host n9"
    )
    assert "not going to commit checkpoint step-10" in str(error)


def test_a_joined_lock_is_watched_not_touched(tmp_path: Path) -> None:
    outer = acquire(tmp_path / "run", me())
    inner = acquire(tmp_path / "run", me(), inherited=outer.token)
    past = time.time() - 50
    os.utime(outer.path, (past, past))
    lost: list[Holder | None] = []
    with Heartbeat(inner, every=0.02, on_lost=lost.append) as watch:
        thief = elsewhere()
        assert not watch.lost.wait(0.2)  # still ours: only looked at
        assert outer.path.stat().st_mtime == past
        plant(tmp_path / "run", thief, age=0)
        assert watch.lost.wait(10)
    assert lost == [thief]


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    holder = Holder.this(new_token(), "", "local", "", pid=child.pid)
    child.wait()
    plant(tmp_path / "run", holder, age=0)
    lock = acquire(tmp_path / "run", me())
    assert f"pid {child.pid} on host {socket.gethostname()}" in (lock.took_over or "")
    assert "is not running any more" in (lock.took_over or "")


def test_a_live_holder_on_this_machine_is_not_taken_over(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        plant(tmp_path / "run", Holder.this(new_token(), "", "local", "", pid=child.pid), age=0)
        with pytest.raises(LockHeld):
            acquire(tmp_path / "run", me())
    finally:
        child.kill()
        child.wait()


def test_process_start_tells_running_zombie_and_reused_apart() -> None:
    assert process_start(os.getpid()) is not None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # exited but not reaped: a zombie counts as gone
    eventually(lambda: process_start(child.pid) is None, timeout=10, interval=0.01, what="the child to exit")
    child.wait()
    reused = dataclasses.replace(me(), pid=os.getpid(), pid_start=(process_start(os.getpid()) or 0) + 1)
    assert reused.gone()  # same pid, other start time: another process
    assert not me().gone() and not elsewhere().gone()


def test_the_launchers_token_joins_without_owning(tmp_path: Path) -> None:
    outer = acquire(tmp_path / "run", me())
    inner = acquire(tmp_path / "run", me(), inherited=outer.token)
    assert not inner.owned and inner.holder == outer.holder
    inner.release()  # the launcher's lock stays
    assert (tmp_path / "run" / LOCK_NAME).exists()
    with pytest.raises(LockHeld):
        acquire(tmp_path / "run", me(), inherited="not-the-token")


def test_release_and_beat_touch_only_our_own_lock(tmp_path: Path) -> None:
    lock = acquire(tmp_path / "run", me())
    past = time.time() - 50
    os.utime(lock.path, (past, past))
    assert lock.beat() and time.time() - lock.path.stat().st_mtime < 5
    thief = elsewhere()
    other = plant(tmp_path / "run", thief, age=0)  # taken over behind our back
    assert not lock.beat()
    lock.release()
    assert Holder.parse(other.read_bytes()) == thief


def test_the_heartbeat_reports_a_lost_lock(tmp_path: Path) -> None:
    lost: list[Holder | None] = []
    lock = acquire(tmp_path / "run", me())
    thief = elsewhere()
    with Heartbeat(lock, every=0.05, on_lost=lost.append) as beat:
        plant(tmp_path / "run", thief, age=0)
        assert beat.lost.wait(10)
    assert lost == [thief]


def test_the_heartbeat_names_a_successor_whose_record_came_a_moment_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a takeover's removal and its new record, or while an editor fills the file, the
    lock is missing or empty: the heartbeat still names who holds it now, not "nobody"."""
    lost: list[Holder | None] = []
    lock = acquire(tmp_path / "run", me())
    thief = elsewhere()
    saw_empty = threading.Event()
    read = lockmod._read

    def watched_read(path: Path) -> bytes | None:
        raw = read(path)
        if raw == b"":
            saw_empty.set()
        return raw

    monkeypatch.setattr(lockmod, "_read", watched_read)
    with Heartbeat(lock, every=0.05, on_lost=lost.append) as beat:
        lock.path.write_bytes(b"")  # truncated in place: the new record is not there yet
        assert saw_empty.wait(10)  # the heartbeat has looked at it: the record comes a moment late
        lock.path.write_bytes(thief.to_bytes())
        assert beat.lost.wait(10)
    assert lost == [thief]


def test_a_lock_that_stays_unreadable_is_lost_after_a_second(tmp_path: Path) -> None:
    lock = acquire(tmp_path / "run", me())
    lock.path.write_bytes(b"{half a rec")
    started = time.monotonic()
    assert not lock.beat() and lock.current() is None
    assert 0.9 < time.monotonic() - started < 5


def test_held_releases_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), held(tmp_path / "run", me()):
        assert (tmp_path / "run" / LOCK_NAME).exists()
        raise RuntimeError
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_an_unreadable_lock_is_refused_while_touched_and_taken_once_stale(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / LOCK_NAME
    path.write_text("not json")
    old = time.time() - 10
    os.utime(path, (old, old))
    waiting = threading.Event()
    toucher = threading.Thread(target=lambda: waiting.wait(20) and os.utime(path))
    toucher.start()
    with pytest.raises(LockHeld, match="a holder whose record cannot be read"):
        acquire(tmp_path / "run", me(), stale_after=60, on_wait=lambda _: waiting.set())
    toucher.join()
    old = time.time() - stale_seconds() - 10
    os.utime(path, (old, old))
    assert acquire(tmp_path / "run", me(every=0.1), stale_after=0.5).took_over


def test_owner_comes_from_the_scheduler_but_not_from_the_local_stand_in() -> None:
    assert owner_from_env({"SLURM_JOB_ID": "12"}) == "slurm:12"
    assert owner_from_env({"SLURM_JOB_ID": "12", "DIST_JOBS_BACKEND": "local"}) == ""
    assert owner_from_env({"DIST_JOBS_LOCK_OWNER": "k8s:pytorchjob/ml/a", "SLURM_JOB_ID": "12"}) == (
        "k8s:pytorchjob/ml/a"
    )
    k8s = dataclasses.replace(elsewhere(), backend="k8s", owner="k8s:pytorchjob/ml/resnet")
    assert k8s.stop_hint() == "kubectl delete pytorchjob resnet -n ml"
    assert me().stop_hint() == f"kill -TERM {os.getpid()} on host {socket.gethostname()}"


def _contend(run_dir: str, owner: str, start: float, results: multiprocessing.Queue, done: Any) -> None:  # type: ignore[type-arg]
    while time.time() < start:
        pass  # spin, not sleep: every contender leaves this loop within the same millisecond
    try:
        me = Holder.this(new_token(), owner, "test", "", every=0.1)
        results.put(acquire(Path(run_dir), me, stale_after=1.0).token)
    except LockHeld:
        results.put(None)
    # Stay alive until every contender has answered: a winner whose process has ended is provably
    # gone, and a contender still retrying would rightly take its lock over.
    done.wait(60)


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale"])
def test_of_many_runs_starting_at_once_exactly_one_holds_it(tmp_path: Path, stale: bool) -> None:
    """Eight processes at the same instant, on a free lock and on a stale one they all want to
    break: one wins, seven are refused, and the file names the winner."""
    run_dir = tmp_path / "run"
    if stale:
        plant(run_dir, elsewhere(), age=stale_seconds() + 60)
    context = multiprocessing.get_context("spawn")
    results, done = context.Queue(), context.Event()
    start = time.time() + 2.0
    procs = [
        context.Process(target=_contend, args=(str(run_dir), f"owner-{i}", start, results, done)) for i in range(8)
    ]
    for proc in procs:
        proc.start()
    tokens = [results.get(timeout=HUNG_S) for _ in procs]
    done.set()
    for proc in procs:
        proc.join(timeout=HUNG_S)
    winners = [t for t in tokens if t]
    assert len(winners) == 1, tokens
    assert Holder.parse((run_dir / LOCK_NAME).read_bytes()).token == winners[0]  # type: ignore[union-attr]


# -- lockctl: the same lock from a shell -----------------------------------------------------------


def test_a_heartbeat_slower_than_a_third_of_the_stale_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        acquire(tmp_path / "run", me(every=11), stale_after=30)
    text = f"{caught.value} {caught.value.hint}"
    assert caught.value.exit_code == 2
    assert "DIST_JOBS_LOCK_HEARTBEAT_SECONDS=11 is more than a third of DIST_JOBS_LOCK_STALE_SECONDS=30" in text
    assert "at most 10, or DIST_JOBS_LOCK_STALE_SECONDS to at least 33" in text
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert acquire(tmp_path / "run", me(every=10), stale_after=30).owned  # a third exactly is fine


def test_lockctl_refuses_knobs_that_do_not_fit_together(tmp_path: Path) -> None:
    knobs = {"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "40", "DIST_JOBS_LOCK_STALE_SECONDS": "90"}
    refused = lockctl("acquire", str(tmp_path / "run"), env=knobs)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "HEARTBEAT_SECONDS=40 is more than a third of DIST_JOBS_LOCK_STALE_SECONDS=90" in refused.stderr
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def lockctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([*LOCKCTL, *args], capture_output=True, text=True, env=environ, timeout=HUNG_S)


def test_lockctl_acquire_refuse_heartbeat_release(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = lockctl("acquire", str(run_dir), "--backend", "slurm", env={"SLURM_JOB_ID": "501"})
    assert first.returncode == 0, first.stderr
    token = first.stdout.strip()
    second = lockctl("acquire", str(run_dir), "--backend", "slurm", env={"SLURM_JOB_ID": "502"})
    assert second.returncode == 2
    assert second.stderr.startswith(f"dist-jobs: run directory {run_dir} is in use by another run (slurm job 501")
    assert "scancel 501" in second.stderr and "Traceback" not in second.stderr
    alive = lockctl("acquire", str(run_dir), "--backend", "slurm", env={"SLURM_JOB_ID": "501"})
    assert alive.returncode == 2  # the same job, but its holder's process runs here: that attempt lives
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    path = run_dir / LOCK_NAME
    path.write_bytes(dataclasses.replace(Holder.parse(path.read_bytes()), pid=ended.pid).to_bytes())  # type: ignore[arg-type]
    requeued = lockctl("acquire", str(run_dir), "--backend", "slurm", env={"SLURM_JOB_ID": "501"})
    assert requeued.returncode == 0 and "is not running any more" in requeued.stderr
    token = requeued.stdout.strip()

    past = time.time() - 50
    os.utime(path, (past, past))
    beat = subprocess.Popen(
        [*LOCKCTL, "heartbeat", str(run_dir), token, "--every", "0.05"], env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        beating = lambda: path.stat().st_mtime > past + 10
        eventually(beating, timeout=HUNG_S, interval=0.05, what="a heartbeat")
        beat.terminate()  # ignored: a stopping job's ranks may still be checkpointing
        os.utime(path, (past, past))
        eventually(beating, timeout=HUNG_S, interval=0.05, what="a heartbeat after the SIGTERM")
        assert beat.poll() is None
        assert lockctl("release", str(run_dir), "not-ours").returncode == 0 and path.exists()
        assert lockctl("release", str(run_dir), token).returncode == 0 and not path.exists()
        assert beat.wait(timeout=10) == 0  # released: nothing left to beat
    finally:
        beat.kill()
        beat.wait()


def test_a_newcomer_that_judged_a_stale_lock_late_leaves_the_new_holders_lock_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B judged the stale lock; A broke it and took the lock first. B's break must not move A's
    lock aside: in that instant a third newcomer would take the lock too (two holders)."""
    run_dir = tmp_path / "run"
    path = plant(run_dir, elsewhere(), age=stale_seconds() + 60)
    judged = takeover.look(path)
    assert judged is not None
    first = acquire(run_dir, me("A", every=0.1), stale_after=0.5)  # A breaks the stale lock and takes it
    assert first.owned and first.took_over  # it took the stale lock over
    rename = os.rename

    def third_takes_the_free_path(src: Any, dst: Any) -> None:
        rename(src, dst)
        lockmod.write_new(path, me("C").to_bytes())  # C's create lands while the path is free

    monkeypatch.setattr(lockmod.os, "rename", third_takes_the_free_path)
    assert takeover.break_stale(path, judged, me("B").to_bytes(), {}) is False  # B, late
    held = lockmod.current(path)
    assert held is not None and held.token == first.token, held
    first.release()
