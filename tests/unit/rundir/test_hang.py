"""The hang record (dist_jobs.rundir.hang): what it says of the rank that stopped, in the one
sentence every backend's status shows, and records of older versions read as before."""

from __future__ import annotations

import json
from pathlib import Path

from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.rundir.hang import HANG_RECORD, HangRecord, StoppedRank, describe_hang, read_hang, write_hang


def test_the_sentence_names_the_rank_that_stopped_not_the_one_that_fired() -> None:
    record = HangRecord(rank=0, step=812, stopped=(StoppedRank(3, "n2", 812),), others="all_reduce", compared=4)
    assert describe_hang(record) == "hang: rank 3 on n2 stopped at step 812; the others wait in all_reduce"
    assert describe_exit(200, hang=record) == f"{describe_hang(record)} (exit 200)"
    assert describe_exit(3, hang=record) == "exit 3"  # a record beside another exit is not its cause


def test_several_stopped_ranks_and_none() -> None:
    two = HangRecord(rank=0, stopped=(StoppedRank(1, "n0", 5), StoppedRank(3, "n1", 4)), compared=4)
    assert describe_hang(two) == "hang: ranks 1 on n0, 3 on n1 stopped at steps 4, 5"
    alike = HangRecord(rank=2, step=7, compared=4)
    assert (
        describe_hang(alike) == "hang: all 4 ranks stopped at step 7, none before the others (rank 2's watchdog fired)"
    )


def test_a_record_round_trips_and_an_older_versions_reads_as_before(tmp_path: Path) -> None:
    record = HangRecord(1, 6, 5.0, 2, "42", "n0", (StoppedRank(3, "n1", 6),), "backward", 4)
    write_hang(tmp_path, record)
    assert read_hang(tmp_path) == record
    (tmp_path / HANG_RECORD).write_text(json.dumps({"rank": 1, "step": 6, "time": 5.0, "attempt": 0, "job": ""}))
    old = read_hang(tmp_path)
    assert old == HangRecord(rank=1, step=6, time=5.0)
    assert old is not None and old.belongs_to(attempt=0) and describe_hang(old) == "hang (rank 1)"
