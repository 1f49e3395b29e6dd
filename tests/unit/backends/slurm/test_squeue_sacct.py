"""The sbatch/squeue/sacct parsers against output captured from a real Slurm 22.05 cluster.

The fixtures (tests/fixtures/slurm/, commands in INDEX.md) are verbatim; the same commands run on
the live local cluster in tests/integration/test_slurm_parsers.py.
"""

from __future__ import annotations

import random
from datetime import datetime

import pytest

from dist_jobs.backends.slurm.sbatch import parse_sbatch_job_id, parse_sbatch_test_only, sbatch_error
from dist_jobs.backends.slurm.squeue_sacct import (
    SQUEUE_FORMAT_LONG,
    QueuedJob,
    SacctJobState,
    parse_duration,
    parse_sacct,
    parse_squeue,
    parse_timestamp,
    sacct_job_state,
)
from dist_jobs.errors import BackendError
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- sbatch ---------------------------------------------------------------------------------


def test_parsable_job_id_plain_and_with_cluster() -> None:
    assert parse_sbatch_job_id(fixture("sbatch_parsable.txt")) == "26"
    assert parse_sbatch_job_id(fixture("sbatch_parsable_cluster.txt")) == "27"


@pytest.mark.parametrize("stdout", ["", "\n", "Submitted batch job 12\n", "abc;cluster"])
def test_parsable_job_id_rejects_other_output(stdout: str) -> None:
    with pytest.raises(BackendError, match="no job id"):
        parse_sbatch_job_id(stdout)


def test_test_only_estimate() -> None:
    idle = parse_sbatch_test_only(fixture("sbatch_test_only.txt"))
    assert (idle.job_id, idle.cpus, idle.nodelist, idle.partition) == ("107", 4, "n[1-2]", "debug")
    assert idle.start == datetime(2026, 11, 22, 5, 27, 36)
    busy = parse_sbatch_test_only(fixture("sbatch_test_only_busy.txt"))
    assert busy.start is not None and busy.start.year == 6109
    far = parse_sbatch_test_only(fixture("sbatch_test_only_busy.txt").replace("6109", "10193"))
    assert far.start is None
    with pytest.raises(BackendError, match="no estimate"):
        parse_sbatch_test_only(fixture("sbatch_err_too_many_nodes.txt"))


@pytest.mark.parametrize(
    ("name", "rc", "says", "hint"),
    [
        ("sbatch_err_invalid_partition.txt", 1, "no partition 'nosuch'", "sinfo -s"),
        ("sbatch_err_too_many_nodes.txt", 1, "node count", "sinfo -N"),
        ("sbatch_err_too_many_cpus.txt", 1, "more CPUs/tasks", "procs_per_node"),
        ("sbatch_err_memory.txt", 1, "Memory specification can not be satisfied", "memory"),
        ("sbatch_err_invalid_time.txt", 255, "time limit", "D-HH:MM:SS"),
        ("sbatch_err_missing_script.txt", 1, "could not read a batch script", "#!/bin/bash"),
        ("sbatch_err_no_controller.txt", 1, "cannot reach the SLURM controller", "scontrol ping"),
        ("sbatch_err_munge_down.txt", 1, "munge", "munge -n"),
    ],
)
def test_sbatch_errors_get_a_message_and_hint(name: str, rc: int, says: str, hint: str) -> None:
    stderr = fixture(name)
    err = sbatch_error(stderr, rc)
    assert isinstance(err, BackendError)
    assert says in err.message
    assert err.hint is not None and hint in err.hint
    # sbatch's own last words stay in the message, without the repeated prefix
    last = stderr.strip().splitlines()[-1].replace("sbatch: error: ", "")
    assert last in err.message and "sbatch: error:" not in err.message


def test_sbatch_error_names_the_cluster_size_when_known() -> None:
    err = sbatch_error(fixture("sbatch_err_too_many_nodes.txt"), 1, cluster_nodes=2)
    assert "this cluster has 2 nodes" in err.message
    assert "cluster has" not in sbatch_error(fixture("sbatch_err_too_many_nodes.txt"), 1).message


@pytest.mark.parametrize(
    ("stderr", "says"),
    [
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
            "account",
        ),
        ("sbatch: error: Batch job submission failed: Invalid qos specification", "QOS"),
    ],
)
def test_sbatch_errors_known_from_the_slurm_sources(stderr: str, says: str) -> None:
    # Our cluster enforces no associations, so these two texts come from 22.05's slurm_errno.c.
    assert says in sbatch_error(stderr, 1).message


def test_unknown_sbatch_error_keeps_the_text_and_exit_code() -> None:
    err = sbatch_error("sbatch: error: something new\n", 7)
    assert err.message == "sbatch failed with exit code 7: something new"
    assert "(no message)" in sbatch_error("", 1).message


# --- squeue ---------------------------------------------------------------------------------


def test_squeue_pending_and_running() -> None:
    jobs = {j.job_id: j for j in parse_squeue(fixture("squeue_format.txt"))}
    assert set(jobs) == {"33", "34", "35", "36"}
    run = jobs["33"]
    assert (run.state, run.reason, run.nodes, run.nodelist, run.name) == ("RUNNING", "None", 2, "n[1-2]", "fx-running")
    assert (run.time_used_s, run.time_limit_s, run.partition) == (6, 1800, "debug")
    assert run.start_time == datetime(2026, 11, 22, 5, 22, 30)
    assert run.restarts is None  # %-codes cannot show it
    pend = jobs["34"]
    assert (pend.state, pend.reason, pend.nodelist, pend.name) == ("PENDING", "Resources", "", "fx-pending|pipe name")
    assert pend.time_limit_s == 86400 and pend.start_time is not None  # the scheduler's estimate
    assert (jobs["35"].reason, jobs["35"].time_limit_s, jobs["35"].start_time) == ("Priority", 300, None)
    assert (jobs["36"].reason, jobs["36"].time_limit, jobs["36"].time_limit_s) == ("JobHeldUser", "UNLIMITED", None)


def test_squeue_long_format_has_restart_count() -> None:
    short = parse_squeue(fixture("squeue_format.txt"))
    long = parse_squeue(fixture("squeue_format_long.txt"), SQUEUE_FORMAT_LONG)
    assert [j.restarts for j in long] == [0, 0, 0, 0]

    def key(j: QueuedJob) -> tuple[str, str, str, str]:
        return (j.job_id, j.name, j.state, j.reason)

    assert [key(j) for j in long] == [key(j) for j in short]
    (requeued,) = parse_squeue(fixture("squeue_requeued_pending_long.txt"), SQUEUE_FORMAT_LONG)
    assert (requeued.state, requeued.reason, requeued.restarts) == ("PENDING", "BeginTime", 1)
    (again,) = parse_squeue(fixture("squeue_requeued_running_long.txt"), SQUEUE_FORMAT_LONG)
    assert (again.state, again.nodelist, again.restarts) == ("RUNNING", "n[1-2]", 1)
    (short_requeued,) = parse_squeue(fixture("squeue_requeued_pending.txt"))
    assert (short_requeued.reason, short_requeued.restarts) == ("BeginTime", None)


def test_squeue_format_mismatch_is_an_error() -> None:
    with pytest.raises(BackendError, match="columns"):
        parse_squeue("33|RUNNING|None\n")
    assert parse_squeue("") == [] and parse_squeue("\n") == []


def test_squeue_forgets_finished_jobs() -> None:
    # After MinJobAge squeue errors out: the backend must fall back to sacct.
    assert "Invalid job id specified" in fixture("squeue_err_unknown_job.txt")


# --- sacct ----------------------------------------------------------------------------------


def state_of(name: str, job_id: str) -> SacctJobState | None:
    return sacct_job_state(parse_sacct(fixture(name)), job_id)


def test_sacct_rows_and_steps() -> None:
    rows = parse_sacct(fixture("sacct_cancelled.txt"))
    assert [r.job_id for r in rows] == ["32", "32.batch", "32.0"]
    assert [r.is_allocation for r in rows] == [True, False, False]
    assert [r.step for r in rows] == [None, "batch", "0"]
    alloc = rows[0]
    assert (alloc.state, alloc.state_detail, alloc.name, alloc.nnodes) == ("CANCELLED", "by 0", "fx-cancelled", 2)
    assert (rows[1].exit_code, rows[1].exit_signal) == (0, 15)
    assert rows[0].elapsed_s == 2 and rows[0].end == datetime(2026, 11, 22, 5, 22, 28)


@pytest.mark.parametrize(
    ("name", "job_id", "state", "exit_code", "nodelist", "attempts"),
    [
        ("sacct_completed.txt", "30", "COMPLETED", 0, "n[1-2]", 1),
        ("sacct_failed.txt", "31", "FAILED", 3, "n1", 1),
        ("sacct_cancelled.txt", "32", "CANCELLED", 0, "n[1-2]", 1),
        ("sacct_running.txt", "33", "RUNNING", 0, "n[1-2]", 1),
        ("sacct_pending.txt", "40", "PENDING", 0, "None assigned", 1),
        ("sacct_timeout.txt", "37", "TIMEOUT", 0, "n1", 1),
        ("sacct_requeued.txt", "38", "COMPLETED", 0, "n[1-2]", 2),
        ("sacct_requeued_pending.txt", "38", "REQUEUED", 0, "n[1-2]", 1),
        ("sacct_requeued_no_duplicates.txt", "38", "COMPLETED", 0, "n[1-2]", 1),
    ],
)
def test_sacct_job_state(name: str, job_id: str, state: str, exit_code: int, nodelist: str, attempts: int) -> None:
    got = state_of(name, job_id)
    assert got is not None
    assert (got.state, got.exit_code, got.nodelist, got.attempts) == (state, exit_code, nodelist, attempts)


def test_sacct_details() -> None:
    failed = state_of("sacct_failed.txt", "31")
    assert failed is not None and (failed.name, failed.exit_signal) == ("fx-failed", 0)
    running = state_of("sacct_running.txt", "33")
    assert running is not None and running.end is None and running.start is not None
    pending = state_of("sacct_pending.txt", "40")
    assert pending is not None and pending.start is None and pending.name == "fx-pending|pipe name"
    timeout = state_of("sacct_timeout.txt", "37")
    assert timeout is not None and parse_duration(timeout.elapsed) == 77
    requeued = state_of("sacct_requeued.txt", "38")
    assert requeued is not None and requeued.start == datetime(2026, 11, 22, 5, 22, 56)


def test_sacct_right_after_the_job_ended() -> None:
    # slurmdbd had not merged the job record yet: name "allocation", one node, no partition;
    # the state and exit code are already final, which is what the backend reads.
    done = state_of("sacct_completed_just_finished.txt", "30")
    assert done is not None and (done.state, done.exit_code, done.name) == ("COMPLETED", 0, "allocation")
    failed = state_of("sacct_failed_just_finished.txt", "31")
    assert failed is not None and (failed.state, failed.exit_code) == ("FAILED", 3)


def test_sacct_knows_nothing_yet() -> None:
    assert parse_sacct(fixture("sacct_pending_just_submitted.txt")) == []
    assert sacct_job_state([], "34") is None
    assert state_of("sacct_completed.txt", "999") is None


def test_latest_attempt_wins_whatever_the_row_order() -> None:
    rows = parse_sacct(fixture("sacct_requeued.txt"))
    rng = random.Random(7)
    for _ in range(20):
        shuffled = rows[:]
        rng.shuffle(shuffled)
        got = sacct_job_state(shuffled, "38")
        assert got is not None and (got.state, got.attempts) == ("COMPLETED", 2)


def test_sacct_line_with_wrong_width_is_an_error() -> None:
    with pytest.raises(BackendError, match="columns"):
        parse_sacct("30|30|COMPLETED\n")


# --- durations and timestamps ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:00", 0),
        ("0:06", 6),
        ("5:00", 300),
        ("30:00", 1800),
        ("00:01:17", 77),
        ("2:03:04", 7384),
        ("1-00:00:00", 86400),
        ("3-01:02:03", 262923),
        ("UNLIMITED", None),
        ("INVALID", None),
    ],
)
def test_parse_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "-1:00"])
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(BackendError, match="duration"):
        parse_duration(text)


def test_parse_timestamp() -> None:
    assert parse_timestamp("2026-11-22T05:22:30") == datetime(2026, 11, 22, 5, 22, 30)
    assert parse_timestamp("Unknown") is None and parse_timestamp("N/A") is None
    with pytest.raises(BackendError, match="timestamp"):
        parse_timestamp("yesterday")
