"""`dist-jobs status` of a running SLURM job whose ranks have not all joined: "waiting for ranks
2-3 on n2 to join for 1m40s" (dist_jobs.backends.slurm.joining), from the run's own folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dist_jobs.backends.slurm.joining import JOIN_GRACE_S, joining, not_joined, ranks_told, running_step, waiting_for
from dist_jobs.rundir.beats import Beat, write_beat

NODES = ["n1", "n2"]


@pytest.mark.parametrize(
    "ranks,told", [([2], "rank 2"), ([2, 3], "ranks 2-3"), ([4, 0, 1], "ranks 0-1, 4"), ([1, 3], "ranks 1, 3")]
)
def test_ranks_are_told_as_ranges(ranks: list[int], told: str) -> None:
    assert ranks_told(ranks) == told


def test_the_ranks_are_grouped_by_their_node() -> None:
    assert waiting_for([2, 3], NODES, 2, 100) == "waiting for ranks 2-3 on n2 to join for 1m40s"
    assert waiting_for([1, 2], NODES, 2, 61) == "waiting for rank 1 on n1, rank 2 on n2 to join for 1m01s"


def test_the_ranks_that_did_not_start_are_waited_for_else_those_that_did_not_join() -> None:
    assert not_joined(4, started={0, 1}, joined=set()) == [2, 3]
    assert not_joined(4, started={0, 1, 2, 3}, joined={0, 1, 2}) == [3]
    assert not_joined(4, started={0, 1, 2, 3}, joined=set()) == []  # nothing tells them apart
    assert not_joined(4, started={0, 1, 2, 3}, joined={0, 1, 2, 3}) == []
    assert not_joined(4, started={0, 1, 2, 3}, joined=set(), silent={3, 2}) == [2, 3]  # a node that died
    assert not_joined(4, started={0, 1, 2, 3}, joined={0, 1}, silent={3}) == [2, 3]  # the beats say more


def step(logs: Path, job: str, label: str, started: float, tasks: list[int]) -> None:
    """What the batch script and slurmstepd leave of a step: its start stamp, one log per task."""
    logs.mkdir(parents=True, exist_ok=True)
    stamp = logs / f".{job}-attempt{label}.start"
    stamp.touch()
    os.utime(stamp, (started, started))
    for task in tasks:
        (logs / f"run-{job}-attempt{label}-rank{task}.out").write_text("")


def test_a_node_that_never_ran_its_ranks_is_named_after_the_grace(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "ck", tmp_path / "logs"
    step(logs, "7", "1", started=1000.0, tasks=[0, 1])  # attempt 1: n2's tasks never started
    layout = (NODES, 2, False)
    assert joining(run_dir, logs, "run", "7", layout, now=1000.0 + JOIN_GRACE_S - 1) == ""
    said = joining(run_dir, logs, "run", "7", layout, now=1100.0)
    assert said == "waiting for ranks 2-3 on n2 to join for 1m40s"
    # torchrun mode: one task per node, so task 0 is n1's ranks 0-1
    step(logs, "8", "0", started=1000.0, tasks=[0])
    assert joining(run_dir, logs, "run", "8", (NODES, 2, True), now=1100.0) == said


def test_started_ranks_that_never_beat_are_named_once_the_others_do(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "ck", tmp_path / "logs"
    step(logs, "7", "0.1", started=1000.0, tasks=[0, 1, 2, 3])
    for rank in (0, 1, 2):
        write_beat(run_dir, Beat(rank, "n1", step=4, time=1050.0, attempt=0, job="7"))
    write_beat(run_dir, Beat(3, "n2", step=2, time=900.0, attempt=0, job="7"))  # the step before's
    layout = (NODES, 2, False)
    assert joining(run_dir, logs, "run", "7", layout, now=1100.0) == "waiting for rank 3 on n2 to join for 1m40s"
    write_beat(run_dir, Beat(3, "n2", step=4, time=1060.0, attempt=0, job="7"))
    assert joining(run_dir, logs, "run", "7", layout, now=1100.0) == ""


def test_between_steps_nothing_is_said(tmp_path: Path) -> None:
    assert running_step(tmp_path, "7") is None
    assert joining(tmp_path, tmp_path, "run", "7", (NODES, 2, False), now=1e9) == ""
