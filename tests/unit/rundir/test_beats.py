"""Which rank stopped (dist_jobs.rundir.beats): the comparison of every rank's beat that the
firing watchdog makes, on plain data, and the beat files it reads."""

from __future__ import annotations

import json
from pathlib import Path

from dist_jobs.rundir.beats import Beat, beat_path, read_beats, stopped, waiting_in, write_beat

NOW = 1000.0
STALE_S = 3.0


def beat(rank: int, **fields: object) -> Beat:
    values: dict[str, object] = {"host": f"n{rank // 2}", "step": 812, "time": NOW - 0.5, "waiting": "all_reduce"}
    return Beat(rank, **{**values, **fields})  # type: ignore[arg-type]


def ranks(found: list[Beat]) -> list[int]:
    return [b.rank for b in found]


def test_a_rank_whose_beat_went_stale_stopped_whatever_the_others_wait_in() -> None:
    """SIGSTOP: its whole process, watchdog thread too, stopped; the others' beats go on."""
    beats = [beat(0), beat(1), beat(2), beat(3, time=NOW - 9, waiting="backward")]
    assert ranks(stopped(beats, NOW, STALE_S)) == [3]
    assert waiting_in(beats, stopped(beats, NOW, STALE_S)) == "all_reduce"


def test_every_beat_stale_names_none_by_staleness() -> None:
    """A frozen shared file system or a clock jump: staleness tells nothing when it is everyone's."""
    beats = [beat(0, time=NOW - 9), beat(1, time=NOW - 9)]
    assert stopped(beats, NOW, STALE_S) == []


def test_a_rank_that_entered_fewer_collectives_stopped() -> None:
    beats = [beat(0, collectives=41), beat(1, collectives=40, waiting=None), beat(2, collectives=41)]
    assert ranks(stopped(beats, NOW, STALE_S)) == [1]


def test_collective_counts_are_compared_only_when_every_rank_has_one() -> None:
    beats = [beat(0, collectives=41), beat(1, collectives=None), beat(2, collectives=40)]
    assert stopped(beats, NOW, STALE_S) == []


def test_a_rank_in_its_own_code_while_the_others_wait_in_a_collective_stopped() -> None:
    """A dead file system read, a deadlocked data loader: alive, beating, but in no collective."""
    beats = [beat(0, waiting="backward"), beat(1, waiting=""), beat(2, waiting=None), beat(3, waiting="backward")]
    found = stopped(beats, NOW, STALE_S)
    assert ranks(found) == [1]
    assert waiting_in(beats, found) == "backward"


def test_a_rank_behind_in_steps_stopped_when_nothing_else_tells() -> None:
    beats = [beat(0, waiting=None), beat(1, step=811, waiting=None), beat(2, waiting=None)]
    assert ranks(stopped(beats, NOW, STALE_S)) == [1]
    assert waiting_in(beats, []) == ""


def test_ranks_that_all_look_alike_name_none() -> None:
    assert stopped([beat(0), beat(1)], NOW, STALE_S) == []
    assert stopped([], NOW, STALE_S) == []


def test_beats_are_read_for_this_world_job_and_attempt_only(tmp_path: Path) -> None:
    for rank in range(3):
        write_beat(tmp_path, Beat(rank, "n0", 5, NOW, "all_reduce", 7, attempt=1, job="42"))
    write_beat(tmp_path, Beat(3, "n1", 5, NOW, attempt=0, job="42"))  # an earlier attempt's
    beat_path(tmp_path, 4).write_text("{torn")  # a reader never raises on what it finds
    (tmp_path / "beats" / "rank-2.json").write_text(json.dumps({"rank": 1, "job": "42", "attempt": 1}))
    found = read_beats(tmp_path, 5, job="42", attempt=1)
    assert found == [Beat(0, "n0", 5, NOW, "all_reduce", 7, 1, "42"), Beat(1, "n0", 5, NOW, "all_reduce", 7, 1, "42")]
    assert sorted(p.name for p in (tmp_path / "beats").iterdir()) == [f"rank-{r}.json" for r in range(5)]
