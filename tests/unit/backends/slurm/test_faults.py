"""`dist-jobs status` while a SLURM job meets a fault, and after a cancel: real captured output
(tests/fixtures/slurm/, see its INDEX.md, "Faults and cancels (issue 24)")."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from dist_jobs.api.job import Job
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.jobstate import JobState, normalise
from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.backends.slurm.batchlog import finished_status, parse_batch_log
from dist_jobs.backends.slurm.faults import SINFO_NODE_STATES, parse_node_states
from dist_jobs.backends.slurm.squeue_sacct import parse_sacct, sacct_exit, sacct_job_state
from dist_jobs.cli.output import info_table
from dist_jobs.rundir.attempts import Attempts, starts
from dist_jobs.rundir.progress import write_progress
from dist_jobs.rundir.quarantine import QUARANTINE, kept_away
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


class Runner:
    """squeue, sacct and sinfo answer from captured files; None: the command fails (squeue: it
    has forgotten the job)."""

    def __init__(self, **files: str | None) -> None:
        self.files = files
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        name = self.files[argv[0]]
        if name is None:
            said = read("squeue_err_unknown_job.txt") if argv[0] == "squeue" else f"{argv[0]}: error: no answer"
            return subprocess.CompletedProcess(argv, 1, "", said)
        return subprocess.CompletedProcess(argv, 0, read(name), "")


def submitted(tmp_path: Path, job_id: str, runner: Runner, batchlog: str = "") -> SlurmBackend:
    """A jobs dir as `submit` leaves it (run dir and log folder under tmp_path)."""
    run, logs = tmp_path / "ck" / "fx", tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    if batchlog:
        (logs / f"fx-{job_id}.out").write_text(read(batchlog))
    folder = tmp_path / "runs" / f"fx-{job_id}"
    folder.mkdir(parents=True)
    meta = {"job_id": job_id, "run": "fx", "log_dir": str(logs), "run_dir": str(run)}
    (folder / "job.json").write_text(json.dumps(meta))
    return SlurmBackend(runner=runner, jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c")


# --- a node died: the job is requeued, SLURM waits for the node --------------------------------


def nodefail(tmp_path: Path, **files: str | None) -> tuple[Runner, Job]:
    answers: dict[str, str | None] = {
        "squeue": "squeue_completing_nodefail_long.txt",
        "sacct": "sacct_completing_nodefail.txt",
        "sinfo": "sinfo_completing_nodefail.txt",
        **files,
    }
    runner = Runner(**answers)
    slurm = submitted(tmp_path, "7", runner)
    write_progress(tmp_path / "ck" / "fx", json.loads(read("progress_nodefail.json")))
    return runner, Job(Handle("slurm", "7", cluster="distjobs"), slurm)


def test_a_requeued_job_waiting_for_a_dead_node_says_so_without_running_or_an_eta(tmp_path: Path) -> None:
    runner, job = nodefail(tmp_path)
    info = job.status()
    assert (info.state, info.word) == (JobState.REQUEUED, "COMPLETING")
    assert info.detail == (
        "requeued (restart 1) at 2026-11-26 12:42:19; no rank runs: "
        "waiting for SLURM to clean up n2 (not responding) before the job can start again"
    )
    table = info_table(info)
    assert "running" not in table and "eta" not in table, table
    assert table.splitlines()[0] == f"slurm://distjobs/7  fx-nodefail  requeued (COMPLETING)  {info.detail}"
    assert info.progress is not None and info.progress["eta_s"] is None
    sinfo = ["sinfo", "--noheader", "--Node", "--nodes", "n[1-2]", "--format", SINFO_NODE_STATES]  # the allocation's
    assert [argv[0] for argv in runner.calls] == ["squeue", "sacct", "sinfo"] and runner.calls[2] == sinfo


def test_completing_is_told_even_when_sacct_and_sinfo_do_not_answer(tmp_path: Path) -> None:
    _, job = nodefail(tmp_path, sacct=None, sinfo=None)
    info = job.status()
    assert (info.state, info.detail) == (JobState.COMPLETING, "ending: SLURM is stopping the job on n2")
    assert "running" not in info_table(info) and "eta" not in info_table(info)


def test_completing_is_not_running_in_the_shared_vocabulary() -> None:
    assert normalise("COMPLETING") is JobState.COMPLETING and not JobState.COMPLETING.finished


def test_sinfo_names_the_node_that_does_not_answer() -> None:
    nodes = parse_node_states(read("sinfo_completing_nodefail.txt"))
    assert list(nodes) == ["n2"] and not nodes["n2"].responding and nodes["n2"].told() == "n2 (not responding)"
    later = parse_node_states(read("sinfo_nodefail_down.txt"))  # SlurmdTimeout later: marked DOWN
    assert later["n1"].told() == "n1" and later["n2"].told() == "n2 (not responding since 2026-11-26 12:46:55)"


def test_a_requeued_job_pending_for_its_down_node_shows_no_eta(tmp_path: Path) -> None:
    _, job = nodefail(tmp_path, squeue="squeue_nodefail_pending_long.txt")
    info = job.status()
    assert info.state is JobState.PENDING and info.detail.startswith("Nodes required for job are DOWN")
    assert info.progress is not None and info.progress["eta_s"] is None and "eta" not in info_table(info)


def test_attempts_come_from_the_run_directory_where_sacct_merged_them(tmp_path: Path) -> None:
    """Job 7 ran twice (n2 died, requeued, resumed, completed), yet sacct lists one allocation."""
    runner = Runner(squeue=None, sacct="sacct_nodefail_finished.txt")
    slurm = submitted(tmp_path, "7", runner, "batchlog_nodefail.txt")
    state = sacct_job_state(parse_sacct(read("sacct_nodefail_finished.txt")), "7")
    assert state is not None and (state.state, state.attempts) == ("COMPLETED", 1)  # what sacct alone says
    record = tmp_path / "ck" / "fx" / "attempts" / "7"
    record.mkdir(parents=True)
    (record / "batch.done").write_text(read("attempts_nodefail_batch.txt"))  # as `attempts done` leaves it
    status = slurm.status("7")
    assert (status.state, status.detail, status.extra["attempts"]) == ("COMPLETED", "exit 0", "2")


def test_a_success_keeps_its_count_for_status(tmp_path: Path) -> None:
    env = {"DIST_JOBS_CHECKPOINT_DIR": str(tmp_path), "DIST_JOBS_RUN": "fx", "DIST_JOBS_MAX_REQUEUES": "3"}
    batch = Attempts.from_env({**env, "DIST_JOBS_SUBMISSION": "7", "HOSTNAME": "batch"})
    assert batch.start()[0] and batch.start()[0] and starts(tmp_path / "fx", "7") == 2
    batch.done()
    assert batch.count() == 0 and starts(tmp_path / "fx", "7") == 2  # the cap forgets, status does not
    assert starts(tmp_path / "fx", "8") == 0


# --- cancel, a pending cancel, exit 200 ---------------------------------------------------------


def test_a_cancelled_jobs_ranks_read_cancelled(tmp_path: Path) -> None:
    runner = Runner(squeue=None, sacct="sacct_cancelled_running.txt")
    status = submitted(tmp_path, "9", runner, "batchlog_cancelled.txt").status("9")
    assert (status.state, status.detail) == ("CANCELLED", "cancelled at 2026-11-26 12:44:18")
    assert status.ranks == {0: "cancelled on n1", 1: "cancelled on n1"}


def test_a_job_cancelled_while_pending_has_no_exit_code(tmp_path: Path) -> None:
    for sacct in ("sacct_cancelled_pending.txt", "sacct_cancelled_pending_just_cancelled.txt"):
        state = sacct_job_state(parse_sacct(read(sacct)), "8")
        assert state is not None and (state.state, state.exit_code) == ("CANCELLED", 0)  # what sacct says
        status = finished_status(state, "fx-cancelled-pending", "")
        assert status.detail == "cancelled while pending: it never started, so it has no exit code"
        assert (status.extra["nodes"], status.extra["attempts"]) == ("", "0")


def test_exit_200_reads_200_where_sacct_shows_72() -> None:
    state = sacct_job_state(parse_sacct(read("sacct_exit200.txt")), "3")
    assert state is not None and state.exit_code == 72  # sacct keeps 7 bits: `exit 200` reads 72:0
    told = finished_status(state, "fx-exit200", "").detail  # no batch log: sacct's value alone
    assert told == "exit 200 (asked to run again), or exit 72: sacct shows both as 72"
    assert sacct_exit(3, 0) == "exit 3" and sacct_exit(0, 9) == "killed by SIGKILL"


def test_the_batch_logs_exit_200_wins_over_sacct_after_a_node_failure() -> None:
    state = sacct_job_state(parse_sacct(read("sacct_completing_nodefail.txt")), "7")
    assert state is not None and state.state == "REQUEUED"
    batch = [r for r in parse_sacct(read("sacct_completing_nodefail.txt")) if r.job_id == "7.batch"]
    assert (batch[0].exit_code, batch[0].exit_signal) == (72, 0)
    while_completing = read("batchlog_nodefail.txt").split("dist-jobs: batch start 2")[0]  # attempt 0 only
    got = parse_batch_log(while_completing)
    assert got.exit_code == 200 and got.cancelled_at is None  # "CANCELLED ... DUE TO JOB REQUEUE": no cancel
    assert got.ranks[0] == "exit 200 (asked to run again) on n1" and 2 not in got.ranks  # n2 said nothing
    assert parse_batch_log(read("batchlog_nodefail.txt")).exit_code == 0  # the resumed attempt completed


# --- a node kept away (issue 35) ------------------------------------------------------------------


def test_the_node_that_failed_is_named_apart_from_the_one_slurm_still_cleans_up(tmp_path: Path) -> None:
    """SLURM declared n2 down and released it; squeue lists only n1, the batch host, still
    completing: status names n2 as the node that failed, not n1."""
    runner = Runner(
        squeue="squeue_completing_nodefail_released_long.txt",
        sacct="sacct_completing_nodefail_released.txt",
        sinfo="sinfo_completing_nodefail_released.txt",
    )
    info = Job(Handle("slurm", "430", cluster="distjobs"), submitted(tmp_path, "430", runner)).status()
    assert info.state is JobState.COMPLETING
    assert info.detail == (
        "ended (NODE_FAIL) at 2026-11-28 06:54:09; failed: n2 (not responding since 2026-11-28 06:54:09); "
        "SLURM is still cleaning up n1"
    )
    assert runner.calls[2] == ["sinfo", "--noheader", "--Node", "--nodes", "n[1-2]", "--format", SINFO_NODE_STATES]


def test_a_requeued_job_names_the_node_it_keeps_away_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner(squeue="squeue_quarantine_pending_long.txt", sacct=None, sinfo=None)
    slurm = submitted(tmp_path, "430", runner)
    (tmp_path / "ck" / "fx").mkdir(parents=True)
    (tmp_path / "ck" / "fx" / QUARANTINE).write_text(read("quarantine_nodefail.jsonl"))
    record = kept_away(tmp_path / "ck" / "fx", "430")[0]
    monkeypatch.setattr(time, "time", lambda: record.time + 60)  # a minute after the requeue
    info = Job(Handle("slurm", "430", cluster="distjobs"), slurm).status()
    assert info.state is JobState.PENDING
    assert info.detail == f"BeginTime; keeps away from {record.told()}"
    assert record.told().startswith("n2 (n2 no longer answered; until ")
    assert info.extra["kept_away"] == record.told()
    monkeypatch.setattr(time, "time", lambda: record.until + 1)  # expired: nothing said
    assert Job(Handle("slurm", "430", cluster="distjobs"), slurm).status().detail == "BeginTime"


def test_status_names_the_ranks_of_a_silent_node_while_the_others_wait_at_the_rendezvous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n2 died after its tasks started and before any rank joined: every task has its log, no
    rank beats, the job is RUNNING to SLURM, and sinfo says n2 does not answer (captured)."""
    runner = Runner(squeue="squeue_running_node_dead_long.txt", sinfo="sinfo_running_node_dead.txt", sacct=None)
    slurm = submitted(tmp_path, "429", runner)
    meta_path = tmp_path / "runs" / "fx-429" / "job.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "procs_per_node": 2, "launcher": "srun"}))
    now = 1_795_848_554.0
    monkeypatch.setattr(time, "time", lambda: now)
    logs = tmp_path / "logs"
    for name in (".429-attempt0.start", *(f"fx-429-attempt0-rank{r}.out" for r in range(4))):
        (logs / name).touch()
        os.utime(logs / name, (now - 100, now - 100))
    info = Job(Handle("slurm", "429", cluster="distjobs"), slurm).status()
    assert (info.word, info.detail) == ("RUNNING", "waiting for ranks 2-3 on n2 to join for 1m40s")
    assert runner.calls[-1][:4] == ["sinfo", "--noheader", "--Node", "--nodes"] and "n[1-2]" in runner.calls[-1]
