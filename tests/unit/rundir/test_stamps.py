"""Fencing at the storage for the run directory's records (dist_jobs.rundir.stamps): a holder that
lost the lock while stalled in a write lands that write late; no reader believes it.

Each test plays one interleaving: holder A (paused) wakes after B took the run directory over and
lands one write of its own; then what every reader sees. Files without stamps read as before."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from dist_jobs.api.sweep_status import TrialRow, _numbers
from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.hang import (
    HANG_RECORD,
    HangRecord,
    attempt_hang,
    preempted_since,
    read_hang,
    read_preempted,
    write_hang,
    write_preempted,
)
from dist_jobs.rundir.history import HISTORY, append_history
from dist_jobs.rundir.ledger import ledger, note
from dist_jobs.rundir.lock import LOCK_NAME, Lock, acquire, stamp_of
from dist_jobs.rundir.progress import PROGRESS, read_history, read_progress, write_progress
from dist_jobs.rundir.result import read_result, write_result
from dist_jobs.rundir.stamps import believed, live_rows, this_attempts
from support.lock_support import foreign, plant

A, B = foreign("slurm:1", "slurm", "1"), foreign("slurm:2", "slurm", "2")  # the old holder, its successor
OLD, NEW = stamp_of(A.token), stamp_of(B.token)


def _row(step: int, stamp: str, loss: float, time: float | None = None) -> dict[str, object]:
    return {
        "step": step,
        "epoch": 0,
        "time": float(step) if time is None else time,
        "metrics": {"loss": loss},
        "stamp": stamp,
    }


def _progress(step: int, stamp: str) -> dict[str, object]:
    return {"step": step, "total_steps": 100, "epoch": 0, "metrics": {"loss": 9.0}, "state": "running", "stamp": stamp}


def _taken_over(run_dir: Path) -> None:
    """A logged steps 1-4, then B took over, resumed from step 2 and logged steps 3-5; A's late row
    of step 5 (loss 9) lands after B's, as does its late progress.json."""
    for step in range(1, 5):
        append_history(run_dir, _row(step, OLD, 1.0))
    for step in range(3, 6):
        append_history(run_dir, _row(step, NEW, 0.5, time=10.0 + step))
    append_history(run_dir, _row(5, OLD, 9.0, time=30.0))  # late: passed its fence, then stalled


def test_a_stamp_is_retired_once_another_follows_it_and_its_later_rows_are_dropped() -> None:
    rows = [{"s": 1, "stamp": "a"}, {"s": 2}, {"s": 3, "stamp": "b"}, {"s": 4, "stamp": "a"}, {"s": 5, "stamp": ""}]
    kept, retired = live_rows(rows)
    assert [r["s"] for r in kept] == [1, 2, 3, 5] and retired == {"a"}  # unstamped rows always stay
    assert believed("", {"a"}, "b") and not believed("a", {"a"}, None) and not believed("c", set(), "b")
    assert believed("b", {"a"}, "b") and believed("c", set(), None)  # a newcomer not yet in the log
    assert not this_attempts("a", "b", 5.0, 1.0) and this_attempts("a", "a", 5.0, 1.0)
    assert not this_attempts("a", "a", 0.5, 1.0)  # a restart in place keeps its lock: the start decides
    assert this_attempts("", "b", 5.0, 1.0) and this_attempts("a", "", 5.0, 1.0)  # unknown: as before


def test_a_late_metrics_row_of_a_superseded_holder_is_not_read(tmp_path: Path) -> None:
    _taken_over(tmp_path)
    steps = [(r["step"], r["stamp"]) for r in read_history(tmp_path)]
    assert steps == [(1, OLD), (2, OLD), (3, OLD), (4, OLD), (3, NEW), (4, NEW), (5, NEW)]
    # the sweep's table: the best loss is B's, not the late 9 (nor is its step or latest value)
    write_progress(tmp_path, {**_progress(5, NEW), "metrics": {"loss": 0.5}})
    row = TrialRow(0, "t", {}, None, "running")
    _numbers(row, tmp_path, "loss", "max")
    assert (row.step, row.latest, row.best) == (5, 0.5, 1.0)


def test_the_ledger_sees_only_the_successors_rows(tmp_path: Path) -> None:
    """The ledger, like the plot (dist_jobs.api.plot), reads metrics.jsonl through read_history."""
    note(tmp_path, "start", time=0.5, attempt=0, job="7", resumed_step=0)
    note(tmp_path, "start", time=12.0, attempt=1, job="7", resumed_step=2)
    _taken_over(tmp_path)
    with_late = ledger(tmp_path, "7", None, now=40.0)
    lines = (tmp_path / HISTORY).read_text().splitlines()
    (tmp_path / HISTORY).write_text("\n".join(lines[:-1]) + "\n")  # the same run without the late row
    assert with_late == ledger(tmp_path, "7", None, now=40.0)


def test_a_late_progress_of_the_old_holder_is_not_shown_while_the_successor_holds_the_lock(tmp_path: Path) -> None:
    plant(tmp_path, B)
    write_progress(tmp_path, _progress(7, OLD))  # A's, landing after B took the lock, before B logged
    assert read_progress(tmp_path) is None  # B has logged nothing yet: nothing to show
    _taken_over(tmp_path)
    write_progress(tmp_path, _progress(7, OLD))
    shown = read_progress(tmp_path)
    assert shown == {"step": 5, "epoch": 0, "time": 15.0, "metrics": {"loss": 0.5}, "stamp": NEW}  # B's last row
    write_progress(tmp_path, _progress(6, NEW))
    assert read_progress(tmp_path) == _progress(6, NEW)  # B's own record


def test_a_late_progress_of_the_old_holder_is_not_shown_after_the_successor_released(tmp_path: Path) -> None:
    _taken_over(tmp_path)
    write_progress(tmp_path, _progress(7, OLD))  # no LOCK: B ended; A's stamp is retired in the log
    assert not (tmp_path / LOCK_NAME).exists()
    shown = read_progress(tmp_path)
    assert shown is not None and (shown["step"], shown["stamp"]) == (5, NEW)


def test_a_late_result_of_the_old_holder_is_not_the_result(tmp_path: Path) -> None:
    _taken_over(tmp_path)
    write_result(tmp_path, {"loss": 9.0}, OLD)  # B ended (released) before finishing fit()
    with pytest.raises(DistJobsError, match="written late by a run that had lost the run directory"):
        read_result(tmp_path)
    plant(tmp_path, B)  # ... or still holds the run directory
    with pytest.raises(DistJobsError, match="no result"):
        read_result(tmp_path)
    write_result(tmp_path, {"loss": 0.5}, NEW)
    assert read_result(tmp_path) == {"loss": 0.5}  # B's own, without its stamp
    (tmp_path / "result.json").write_text('{"loss": 0.5, "stamp": 3.0}')  # an older version's
    assert read_result(tmp_path) == {"loss": 0.5, "stamp": 3.0}  # a user's metric of that name stays


def test_a_marker_or_hang_record_of_the_old_holder_is_not_the_successors_attempts(tmp_path: Path) -> None:
    since = 100.0  # B's attempt started then; A's late writes land after it
    write_preempted(tmp_path, "12", OLD)
    os.utime(tmp_path / "PREEMPTED", (since + 5, since + 5))
    write_hang(tmp_path, HangRecord(rank=1, step=12, time=since + 5, job="1", stamp=OLD))
    assert not preempted_since(tmp_path, since, NEW) and attempt_hang(tmp_path, since, NEW) is None
    assert preempted_since(tmp_path, since, OLD) and attempt_hang(tmp_path, since, OLD) is not None
    assert preempted_since(tmp_path, since) and attempt_hang(tmp_path, since) is not None  # no stamp known: time
    mine = HangRecord(rank=0, step=20, time=since + 9, job="2", stamp=NEW)
    write_hang(tmp_path, mine)  # the successor's own firing replaces the other holder's record
    assert read_hang(tmp_path) == mine and attempt_hang(tmp_path, since, NEW, job="2") == mine


def test_a_late_hang_record_of_the_old_holder_does_not_replace_the_live_holders(tmp_path: Path) -> None:
    plant(tmp_path, B)  # B holds the run directory
    mine = HangRecord(rank=0, step=20, time=109.0, job="2", stamp=NEW)
    write_hang(tmp_path, mine)
    write_hang(tmp_path, HangRecord(rank=1, step=12, time=110.0, job="1", stamp=OLD))  # A's, late
    assert read_hang(tmp_path) == mine


def test_unstamped_files_of_older_versions_read_as_before(tmp_path: Path) -> None:
    plant(tmp_path, B)
    rows = [{"step": s, "epoch": 0, "time": float(s), "metrics": {"loss": 1.0}} for s in (1, 2, 1)]
    (tmp_path / HISTORY).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_history(tmp_path) == rows
    old = {"step": 2, "total_steps": 10, "epoch": 0, "metrics": {}, "state": "running"}
    (tmp_path / PROGRESS).write_text(json.dumps(old))
    assert read_progress(tmp_path) == old
    (tmp_path / "result.json").write_text('{"loss": 0.25}\n')
    assert read_result(tmp_path) == {"loss": 0.25}
    (tmp_path / "PREEMPTED").write_text("40\n")
    marker = read_preempted(tmp_path)
    assert marker is not None and (marker.why, marker.stamp) == ("40", "")
    assert preempted_since(tmp_path, 0.0, NEW) and not preempted_since(tmp_path, marker.landed + 1, NEW)
    (tmp_path / HANG_RECORD).write_text(json.dumps({"rank": 1, "step": 6, "time": 5.0, "attempt": 0, "job": ""}))
    assert attempt_hang(tmp_path, 5.0, NEW) is not None and attempt_hang(tmp_path, 6.0, NEW) is None


def _takeover_by_b(run_dir: Path) -> Lock:
    """A (planted, not beating) logged steps 1-4; B takes its lock over for real (acquire(), on
    its own clock): its takeover row is its first word in metrics.jsonl."""
    for step in range(1, 5):
        append_history(run_dir, _row(step, OLD, 1.0))
    plant(run_dir, dataclasses.replace(A, every=0.1))
    lock = acquire(run_dir, dataclasses.replace(B, every=0.1), stale_after=0.5)
    assert lock.took_over and lock.owned
    return lock


def test_a_late_row_landing_before_the_successors_first_row_is_dropped(tmp_path: Path) -> None:
    _takeover_by_b(tmp_path)
    append_history(tmp_path, _row(5, OLD, 9.0, time=30.0))  # A's, late: B has logged nothing yet
    append_history(tmp_path, _row(3, NEW, 0.5, time=31.0))
    assert [(r["step"], r["stamp"]) for r in read_history(tmp_path)] == [
        (1, OLD),
        (2, OLD),
        (3, OLD),
        (4, OLD),
        (3, NEW),
    ]


def test_a_successor_that_released_without_logging_still_retires_the_old_holders_late_records(tmp_path: Path) -> None:
    _takeover_by_b(tmp_path).release()  # B ended before its first step (a refused start, an early bug)
    write_progress(tmp_path, _progress(7, OLD))  # A's late writes, after B released
    write_result(tmp_path, {"loss": 9.0}, OLD)
    append_history(tmp_path, _row(7, OLD, 9.0, time=30.0))
    assert not (tmp_path / LOCK_NAME).exists()
    shown = read_progress(tmp_path)
    assert shown is not None and (shown["step"], shown["stamp"]) == (4, OLD)  # A's last row before the takeover
    with pytest.raises(DistJobsError, match="written late by a run that had lost the run directory"):
        read_result(tmp_path)
    assert [r["step"] for r in read_history(tmp_path)] == [1, 2, 3, 4]
