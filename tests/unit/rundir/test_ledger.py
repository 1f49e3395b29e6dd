"""The goodput ledger on plain recorded data: a run restarted in place once and requeued once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_jobs.rundir.history import append_history
from dist_jobs.rundir.ledger import LEDGER, ledger, note, read_events
from dist_jobs.rundir.verdict import Action, Ending, Verdict, record

SUBMITTED = 1000.0


def _attempt(run_dir: Path, start: float, resumed: int, steps: range, saves: dict[int, float]) -> None:
    """A trainer's records: started at `start`, a step a second from 10 s later (the first step at
    start + 10), a metrics row each step, a save of `saves[step]` seconds after those steps."""
    note(run_dir, "start", time=start, attempt=0, job="7", resumed_step=resumed)
    clock = start + 10
    for step in steps:
        if step == steps[0]:
            note(run_dir, "first_step", time=clock, step=step)
        append_history(run_dir, {"step": step, "epoch": 0, "time": clock, "metrics": {"loss": 1.0}})
        if step in saves:
            clock += saves[step]
            note(run_dir, "save", time=clock, step=step, blocked_s=saves[step])
        clock += 1


def _verdict(run_dir: Path, at: float, ending: Ending, action: Action, attempt: str, node: str = "") -> None:
    record(run_dir, "7", Verdict(ending, action, 0, "told", rank=1, node=node, attempt=attempt, time=at))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Submitted at 1000; attempt 0 starts at 1005, steps 1-7 (step 1 at 1015, save of 4 takes
    2 s, step 7 at 1023), rank 1 killed at 1030; restarted in place (0.1) at 1031 from step 4,
    steps 5-9 (step 5 at 1041, save of 8 takes 1 s, step 9 at 1046), node n2 lost at 1050;
    requeued, attempt 1 starts at 1100 from step 8, steps 9-12 (step 9 at 1110), done at 1120."""
    _attempt(tmp_path, 1005.0, 0, range(1, 8), {4: 2.0})
    _verdict(tmp_path, 1030.0, Ending.RANK_KILLED, Action.RESTART, "0")
    _attempt(tmp_path, 1031.0, 4, range(5, 10), {8: 1.0})
    _verdict(tmp_path, 1050.0, Ending.NODE_LOST, Action.REQUEUE, "0.1", node="n2")
    _attempt(tmp_path, 1100.0, 8, range(9, 13), {})
    _verdict(tmp_path, 1120.0, Ending.COMPLETED, Action.DONE, "1")
    return tmp_path


def test_a_restart_in_place_and_a_requeue_lose_the_steps_after_each_resumed_checkpoint(run_dir: Path) -> None:
    found = ledger(run_dir, "7", SUBMITTED, now=5000.0)
    assert found is not None
    first, restarted, requeued = found.attempts
    # attempt 0: step 4 reached at 1018, its save ends at 1020; steps 5-7 recomputed, 1020-1030 lost
    assert (first.attempt, first.resumed_from, first.step_to, first.kept_step, first.lost_steps) == ("0", 0, 7, 4, 3)
    assert (first.startup_s, first.productive_s, first.save_blocked_s, first.lost_s) == (10.0, 3.0, 2.0, 10.0)
    assert (first.ending, first.action, first.rank) == ("rank killed", "restart", 1)
    # 0.1: step 8 reached at 1044, saved by 1045; step 9 recomputed, 1045-1050 lost
    assert (restarted.resumed_from, restarted.step_to, restarted.kept_step, restarted.lost_steps) == (4, 9, 8, 1)
    assert (restarted.startup_s, restarted.productive_s, restarted.lost_s) == (10.0, 3.0, 5.0)
    assert (restarted.ending, restarted.node) == ("node lost", "n2")
    # attempt 1 completed: everything after its first step is kept
    assert (requeued.lost_steps, requeued.startup_s, requeued.productive_s, requeued.lost_s) == (0, 10.0, 10.0, 0.0)
    # each fault's cost: its lost time, then the gap and start-up before the next first step
    assert (first.cost_s, restarted.cost_s, requeued.cost_s) == (10.0 + 1 + 10, 5.0 + 50 + 10, 0.0)
    assert found.wall_s == 120.0  # submitted at 1000, done at 1120: `now` plays no part
    assert (found.queued_s, found.startup_s, found.productive_s) == (5.0 + 1 + 50, 30.0, 16.0)
    assert (found.lost_s, found.lost_steps, found.save_blocked_s, found.faults) == (15.0, 4, 3.0, 2)
    parts = found.queued_s + found.startup_s + found.productive_s + found.lost_s + found.save_blocked_s
    assert parts == pytest.approx(found.wall_s)
    assert found.told() == "goodput 13% (2 faults, 1m26s lost)"


def test_a_job_waiting_for_its_requeue_counts_until_now_and_the_unsaved_steps_as_lost(tmp_path: Path) -> None:
    _attempt(tmp_path, 1005.0, 0, range(1, 8), {4: 2.0})
    _verdict(tmp_path, 1030.0, Ending.PREEMPTED, Action.REQUEUE, "0")
    found = ledger(tmp_path, "7", SUBMITTED, now=1060.0)
    assert found is not None and found.wall_s == 60.0 and found.queued_s == 5.0 + 30
    (only,) = found.attempts
    assert (only.kept_step, only.lost_steps, only.lost_s, only.cost_s) == (4, 3, 10.0, 10.0)


def test_a_running_attempt_ends_now_and_another_submissions_records_do_not_count(tmp_path: Path) -> None:
    _attempt(tmp_path, 900.0, 0, range(1, 3), {})  # an earlier submission of the same run directory
    record(tmp_path, "6", Verdict(Ending.COMPLETED, Action.DONE, 0, time=920.0))
    _attempt(tmp_path, 1002.0, 2, range(3, 6), {})
    found = ledger(tmp_path, "7", SUBMITTED, now=1020.0)
    assert found is not None and [a.resumed_from for a in found.attempts] == [2]
    assert (found.wall_s, found.queued_s, found.startup_s, found.productive_s, found.faults) == (
        20.0,
        2.0,
        10.0,
        8.0,
        0,
    )
    assert found.attempts[0].ending == "" and found.told() == "goodput 40% (no fault)"


def test_no_trainer_start_no_ledger_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    _verdict(tmp_path, 1030.0, Ending.PROGRAM_ERROR, Action.FAIL, "0")
    assert ledger(tmp_path, "7", SUBMITTED, now=2000.0) is None  # a program of its own records no start
    (tmp_path / LEDGER).write_text('{"event": "start", "time": 1001.0, "resumed_step": 0}\n{"event": "sta')
    assert [e["event"] for e in read_events(tmp_path)] == ["start"]
    found = ledger(tmp_path, "7", None, now=2000.0)  # submitted: unknown, the first start then
    assert found is not None and (found.wall_s, found.startup_s, found.faults) == (29.0, 29.0, 1)
    assert json.loads(json.dumps(found.summary()))["percent"] == 0.0


def test_an_event_a_superseded_holder_lands_late_is_not_counted(tmp_path: Path) -> None:
    """Attempt 0's rank 0 (stamp a) is paused past its lease; attempt 1 (stamp b) starts; attempt
    0's save event lands after that: a late write, which the ledger does not count."""
    note(tmp_path, "start", time=1000.0, attempt=0, job="7", resumed_step=0, stamp="a" * 12)
    note(tmp_path, "start", time=1100.0, attempt=1, job="7", resumed_step=0, stamp="b" * 12)
    note(tmp_path, "save", time=1101.0, step=40, blocked_s=30.0, stamp="a" * 12)
    note(tmp_path, "first_step", time=1110.0, step=1, stamp="b" * 12)
    assert [(e["event"], e["stamp"]) for e in read_events(tmp_path)] == [
        ("start", "a" * 12),
        ("start", "b" * 12),
        ("first_step", "b" * 12),
    ]
