"""The trainer's side of fencing at the storage: every record rank 0 and the watchdogs leave in the
run directory carries the holder's stamp, and nothing written from a thread or on the side (the
watchdog's beat, TensorBoard) goes on once the run has lost the lock."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, cast

from dist_jobs.rundir.beats import beat_path
from dist_jobs.rundir.hang import read_hang, read_preempted
from dist_jobs.rundir.history import HISTORY
from dist_jobs.rundir.lock import LOCK_NAME, Fence
from dist_jobs.rundir.progress import PROGRESS
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.live import Live, watchdog
from dist_jobs.train.metrics import Reporter
from dist_jobs.train.runlock import Guard
from support.lock_support import foreign, plant
from support.tiers import requires

pytestmark = requires("torch")


def _held(run_dir: Path) -> tuple[Guard, str]:
    """A guard of a lock this run holds, and the stamp it marks records with."""
    holder = foreign("slurm:1", "slurm", "1")
    plant(run_dir, holder)
    guard = Guard(Fence(run_dir / LOCK_NAME, holder.token))
    return guard, guard.stamp


def _lose(run_dir: Path) -> None:
    plant(run_dir, foreign("slurm:2", "slurm", "2"))  # another run took the run directory over


def test_progress_and_metrics_rows_carry_the_stamp_and_stop_once_the_lock_is_lost(tmp_path: Path) -> None:
    guard, stamp = _held(tmp_path)
    live = Live(tmp_path, 10, 0, guard, owner="slurm:1", clock=lambda: 1.0)
    live.update(2, 0, {"loss": 0.5})
    progress = json.loads((tmp_path / PROGRESS).read_text())
    row = json.loads((tmp_path / HISTORY).read_text())
    assert progress["stamp"] == stamp and len(stamp) == 12
    assert (row["stamp"], row["owner"], row["metrics"]) == (stamp, "slurm:1", {"loss": 0.5})
    _lose(tmp_path)
    live.update(3, 0, {"loss": 0.4})
    assert json.loads((tmp_path / PROGRESS).read_text())["step"] == 2
    assert len((tmp_path / HISTORY).read_text().splitlines()) == 1


def test_the_watchdog_stamps_its_record_and_marker_and_leaves_no_beat_once_the_lock_is_lost(tmp_path: Path) -> None:
    guard, stamp = _held(tmp_path)
    exits: list[int] = []
    config = TrainConfig(hang_min_seconds=10)
    clock = [1000.0]
    dog = watchdog(
        config, 0, tmp_path, 600.0, guard, 1, clock=lambda: clock[0], exit=exits.append, stream=io.StringIO()
    )
    assert dog is not None
    dog.beat(3)
    dog.tick()
    assert beat_path(tmp_path, 0).exists()
    clock[0] += 11.0
    assert dog.check() and exits
    found, marker = read_hang(tmp_path), read_preempted(tmp_path)
    assert found is not None and found.stamp == stamp and marker is not None and marker.stamp == stamp
    beat_path(tmp_path, 0).unlink()
    _lose(tmp_path)
    dog.beat(4)
    clock[0] += 60.0
    dog.tick()  # its thread's next beat, after the loss: none lands
    assert not beat_path(tmp_path, 0).exists() and guard.lost.is_set()


class _Board:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, key: str, value: float, step: int) -> None:
        self.scalars.append((key, value, step))

    def close(self) -> None:
        pass


def test_tensorboard_gets_no_scalar_once_the_lock_is_lost(tmp_path: Path) -> None:
    guard, _ = _held(tmp_path)
    reporter = Reporter(enabled=True, progress=False, tensorboard_dir=None, total_steps=10, holds=guard.holds)
    board = _Board()
    cast(Any, reporter)._writer = board  # the SummaryWriter it opens in the run directory
    reporter.report(1, "train", {"loss": 0.5}, "step 1")
    _lose(tmp_path)
    reporter.report(2, "train", {"loss": 0.4}, "step 2")
    assert board.scalars == [("train/loss", 0.5, 1)]
