"""The hang watchdog inside a checkpoint save (dist_jobs.train.watchdog, dist_jobs.train.live): a
save silences this rank's own idle time, not its peers'. A peer whose whole process stopped
mid-save (SIGSTOP, a dead node) leaves no beat, and the rank that watches it fires once that
silence passes the limit, instead of waiting for it in the save's barrier until the collective
timeout. A peer that goes on beating, however long the save, and silence that only dates from a
stop of this process too (the whole job suspended), are left alone.

A hand-wound clock and checks by hand, as in test_watchdog; the beats are real files."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import cast

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.rundir.beats import Beat, write_beat
from dist_jobs.rundir.hang import job_id, read_hang
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.watchdog import Watchdog
from support.tiers import requires

pytestmark = requires("torch")  # dist_jobs.train.live: the trainer's side


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stepping(clock: Clock, folder: Path, rank: int = 0, world_size: int = 2) -> tuple[Watchdog, list[int], io.StringIO]:
    """Rank `rank`'s watchdog as the trainer builds it, after five 1 s steps: limit 10 s."""
    from dist_jobs.train.live import watchdog

    exits, out = cast(list[int], []), io.StringIO()
    config = TrainConfig(hang_min_seconds=10, hang_factor=2)
    options = {"clock": clock, "exit": exits.append, "stream": out, "linger_s": 0.0}
    dog = watchdog(config, rank, folder, 600.0, world_size=world_size, **options)
    assert dog is not None
    for step in range(1, 6):
        clock.now += 1.0
        dog.beat(step)
    assert dog.limit() == 10
    return dog, exits, out


def peer_beat(folder: Path, rank: int, age_s: float, step: int = 5) -> None:
    from dist_jobs.train.live import attempt_number

    beat = Beat(rank, "n1", step, time.time() - age_s, "barrier", None, attempt_number(), job_id())
    write_beat(folder, beat)


def checks(dog: Watchdog, clock: Clock, seconds: int) -> bool:
    for _ in range(seconds):
        clock.now += 1.0
        if dog.check():
            return True
    return False


def test_a_peer_that_stopped_mid_save_is_named_and_the_watching_rank_exits_to_be_requeued(tmp_path: Path) -> None:
    clock = Clock()
    dog, exits, out = stepping(clock, tmp_path)
    peer_beat(tmp_path, 1, age_s=2)
    with dog.paused():
        assert not checks(dog, clock, 10)  # the peer's silence is within the limit
        peer_beat(tmp_path, 1, age_s=60)  # it has left no beat for a minute: its process stopped
        assert checks(dog, clock, 1)
    assert exits == [REQUEUE_EXIT_CODE]
    text = out.getvalue()
    assert "rank 0: hang watchdog: rank 1 has left no beat for 60 s while this rank waits in a checkpoint save" in text
    assert "limit 10 s" in text and f"exit {REQUEUE_EXIT_CODE} to be requeued" in text
    hang = read_hang(tmp_path)  # the record the status reads names the stopped rank, not the firing one
    assert hang is not None and hang.rank == 0 and [s.rank for s in hang.stopped] == [1], hang


def test_a_save_longer_than_the_limit_with_every_peer_beating_never_fires(tmp_path: Path) -> None:
    clock = Clock()
    dog, exits, out = stepping(clock, tmp_path)
    with dog.paused():
        for _ in range(360):  # an hour's save, the peer's watchdog thread writing its beat meanwhile
            peer_beat(tmp_path, 1, age_s=1)
            assert not checks(dog, clock, 10)
    assert exits == [] and out.getvalue() == ""


def test_each_rank_watches_the_next_in_a_ring(tmp_path: Path) -> None:
    clock = Clock()
    dog, exits, _ = stepping(clock, tmp_path, rank=3, world_size=4)
    peer_beat(tmp_path, 1, age_s=600)  # not rank 3's to watch: rank 0 watches rank 1
    peer_beat(tmp_path, 0, age_s=1)
    with dog.paused():
        assert not checks(dog, clock, 30)
        peer_beat(tmp_path, 0, age_s=30)
        assert checks(dog, clock, 1) and exits == [REQUEUE_EXIT_CODE]


def test_alone_or_before_the_peer_has_a_beat_there_is_no_one_to_judge(tmp_path: Path) -> None:
    clock = Clock()
    alone, exits, _ = stepping(clock, tmp_path / "one", world_size=1)
    with alone.paused():
        assert not checks(alone, clock, 600)
    dog, exits, _ = stepping(clock, tmp_path / "two")
    with dog.paused():
        assert not checks(dog, clock, 600)  # rank 1 wrote no beat of this attempt
    assert exits == []


def test_silence_that_dates_from_this_process_own_stop_is_not_a_peers(tmp_path: Path) -> None:
    """The whole job suspended mid-save: on waking, the peer's beat is as old as the suspension
    until its own thread runs again; this rank judges only once it has been awake a whole limit."""
    clock = Clock()
    dog, exits, out = stepping(clock, tmp_path)
    with dog.paused():
        assert not checks(dog, clock, 1)
        clock.now += 3600.0  # SIGSTOP, a SLURM suspend: this thread's next check comes an hour late
        peer_beat(tmp_path, 1, age_s=3600)
        assert not dog.check()
        assert not checks(dog, clock, 10)
        peer_beat(tmp_path, 1, age_s=1)  # the peer woke too and beats again
        assert not checks(dog, clock, 60)
    assert exits == [] and "woke up 3600 s after its previous check" in out.getvalue()
