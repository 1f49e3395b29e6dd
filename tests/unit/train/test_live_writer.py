"""Rank 0's progress written off the training thread (Live.update(wait=False)): in order, fenced
right before each write, and a flush() that returns whatever a write did."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from dist_jobs.rundir.history import HISTORY
from dist_jobs.rundir.lock import LOCK_NAME, Fence
from dist_jobs.rundir.progress import PROGRESS, read_history, read_progress
from dist_jobs.train.live import Live
from dist_jobs.train.runlock import Guard
from support.lock_support import foreign, plant
from support.tiers import requires

pytestmark = requires("torch")


def test_updates_handed_to_the_thread_land_in_order_before_a_waiting_one(tmp_path: Path) -> None:
    live = Live(tmp_path, 100, 0, clock=lambda: 1.0)
    for step in range(1, 21):
        live.update(step, 0, {"loss": 1.0 / step}, wait=False)
    live.update(21, 0, {"eval_loss": 0.5})  # waits for the twenty before it
    assert [row["step"] for row in read_history(tmp_path)] == list(range(1, 22))
    assert (read_progress(tmp_path) or {})["step"] == 21
    live.close()


def test_the_writes_happen_on_another_thread_and_flush_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, writers = threading.Event(), []

    def slow_write(folder: Path, record: dict[str, object]) -> None:
        writers.append(threading.current_thread().name)
        release.wait(10)
        (folder / PROGRESS).write_text(json.dumps(record))

    monkeypatch.setattr("dist_jobs.train.live.write_progress", slow_write)
    live = Live(tmp_path, 100, 0, clock=lambda: 1.0)
    live.update(10, 0, {"loss": 1.0}, wait=False)  # returns while the write is held
    assert not (tmp_path / PROGRESS).exists()
    release.set()
    live.flush()
    assert json.loads((tmp_path / PROGRESS).read_text())["step"] == 10
    assert writers == ["dist-jobs-progress"]
    live.close()


def test_a_write_on_the_thread_is_fenced_and_a_failing_one_does_not_hang_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = foreign("slurm:1", "slurm", "1")
    plant(tmp_path, holder)
    live = Live(tmp_path, 100, 0, Guard(Fence(tmp_path / LOCK_NAME, holder.token)), clock=lambda: 1.0)
    calls: list[int] = []

    def broken(folder: Path, record: dict[str, object]) -> None:
        calls.append(int(str(record["step"])))
        raise RuntimeError("a bug in a write")

    with monkeypatch.context() as patch:
        patch.setattr("dist_jobs.train.live.write_progress", broken)
        live.update(10, 0, {"loss": 1.0}, wait=False)
        live.flush()  # returns: the thread logged the bug and goes on
    assert calls == [10]
    live.update(20, 0, {"loss": 0.5}, wait=False)
    live.flush()
    assert (read_progress(tmp_path) or {})["step"] == 20
    plant(tmp_path, foreign("slurm:2", "slurm", "2"))  # another run took the run directory over
    live.update(30, 0, {"loss": 0.4}, wait=False)
    live.close()
    # The files as they are (readers no longer believe them: their stamp is superseded).
    assert json.loads((tmp_path / PROGRESS).read_text())["step"] == 20  # the write was refused at its fence
    assert [json.loads(line)["step"] for line in (tmp_path / HISTORY).read_text().splitlines()] == [10, 20]
