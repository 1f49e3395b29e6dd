"""How a SLURM job ended, from its batch log: real logs captured from the test cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.backends.slurm.batchlog import finished_status, parse_batch_log, srun_failures
from dist_jobs.backends.slurm.squeue_sacct import parse_sacct, sacct_job_state
from dist_jobs.rundir.verdict import Evidence, Failure, decide
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_the_rank_that_failed_first_and_its_code_where_sacct_says_15() -> None:
    state = sacct_job_state(parse_sacct(read("sacct_rank1_exit3.txt")), "98")
    assert state is not None and (state.state, state.exit_code) == ("FAILED", 15)  # what sacct alone says
    got = parse_batch_log(read("batchlog_rank1_exit3.txt"))
    assert got.first_failed == 1 and got.exit_code == 143 and got.attempt == 0
    assert got.ranks == {
        1: "exit 3 on n1",
        0: "stopped (SIGTERM) after another rank failed on n1",
        2: "stopped (SIGTERM) after another rank failed on n2",
        3: "stopped (SIGTERM) after another rank failed on n2",
    }
    assert got.summary == "rank 1 failed first: exit 3 on n1"


def test_a_rank_killed_by_a_signal_is_named() -> None:
    got = parse_batch_log(read("batchlog_rank1_killed.txt"))
    assert got.first_failed == 1 and got.ranks[1] == "killed by SIGKILL on n1"
    assert got.summary == "rank 1 failed first: killed by SIGKILL on n1"


def test_requeues_used_up_reads_n_of_n_and_200_not_72() -> None:
    state = sacct_job_state(parse_sacct(read("sacct_requeues_used_up.txt")), "104")
    assert state is not None and (state.exit_code, state.attempts) == (72, 2)
    got = parse_batch_log(read("batchlog_requeues_used_up.txt"))
    assert (got.attempt, got.exit_code, got.requeues_used_up, got.first_failed) == (1, 200, 1, None)
    assert got.ranks[0] == "exit 200 (asked to run again) on n1"
    assert got.summary == "preempted with the requeues used up (1 of 1)"


def test_a_job_that_lost_its_lock_says_so_not_killed_by_sigkill() -> None:
    """Job 29 was suspended past the stale limit, job 30 took the run directory over; resumed,
    29's heartbeat killed its step (srun: Killed) and the script exited 6."""
    got = parse_batch_log(read("batchlog_lock_lost.txt"))
    assert got.ranks == {0: "killed by SIGKILL on n1"} and got.lock_lost is not None
    assert got.summary == (
        "lost the run directory lock to another run (now held by slurm job 30, pid 18313 on host n2, "
        "started 2026-11-26 13:03:56): stopped without writing more (exit 6)"
    )


def test_an_empty_or_foreign_log_says_nothing() -> None:
    got = parse_batch_log("hello\n")
    assert (got.first_failed, got.exit_code, got.ranks, got.summary) == (None, None, {}, "")


def _submitted(tmp_path: Path, job_id: str, run: str, batchlog: str) -> SlurmBackend:
    """A jobs dir as `submit` leaves it, with the job's real batch log in its log folder."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    (tmp_path / "logs" / f"{run}-{job_id}.out").write_text(read(batchlog))
    folder = tmp_path / "runs" / f"{run}-{job_id}"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"job_id": job_id, "run": run, "log_dir": str(tmp_path / "logs")}))
    return SlurmBackend(runner=Runner(job_id), jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c")


class Runner:
    """squeue has forgotten the job; sacct answers from the captured file."""

    def __init__(self, job_id: str) -> None:
        self.sacct = {
            "98": "sacct_rank1_exit3.txt",
            "104": "sacct_requeues_used_up.txt",
            "31": "sacct_failed_just_finished.txt",
        }[job_id]

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 1, "", read("squeue_err_unknown_job.txt"))
        return subprocess.CompletedProcess(argv, 0, read(self.sacct), "")


def test_status_names_the_failed_rank_and_every_ranks_end(tmp_path: Path) -> None:
    status = _submitted(tmp_path, "98", "fx-rank1-fails", "batchlog_rank1_exit3.txt").status("98")
    assert (status.state, status.detail) == ("FAILED", "rank 1 failed first: exit 3 on n1")
    assert status.ranks[1] == "exit 3 on n1" and len(status.ranks) == 4


def test_status_says_requeues_used_up(tmp_path: Path) -> None:
    status = _submitted(tmp_path, "104", "fx-requeues-used-up", "batchlog_requeues_used_up.txt").status("104")
    assert (status.state, status.detail) == ("FAILED", "preempted with the requeues used up (1 of 1)")
    assert "72" not in status.detail and status.extra["attempts"] == "2"


def test_status_right_after_the_end_shows_the_run_name_not_a_placeholder(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    status = _submitted(tmp_path, "31", "fx-failed", "batchlog_rank1_exit3.txt")
    (tmp_path / "logs" / "fx-failed-31.out").unlink()  # no log: sacct's word alone
    got = status.status("31")
    assert (got.name, got.detail) == ("fx-failed", "exit 3")


def test_a_running_jobs_reason_is_not_the_word_none(tmp_path: Path) -> None:
    def squeue(argv: list[str]) -> subprocess.CompletedProcess[str]:
        line = read("squeue_format_long.txt").splitlines()[3]  # 33 RUNNING, Reason None
        return subprocess.CompletedProcess(argv, 0, line + "\n", "")

    status = SlurmBackend(runner=squeue, jobs_dir=tmp_path, cwd=tmp_path).status("33")
    assert (status.state, status.detail) == ("RUNNING", "")


def test_in_torchrun_mode_srun_tasks_are_nodes_not_ranks() -> None:
    state = sacct_job_state(parse_sacct(read("sacct_rank1_exit3.txt")), "98")
    assert state is not None
    status = finished_status(state, "run", read("batchlog_rank1_exit3.txt"), launcher="torchrun")
    assert status.detail == "node 1 failed first: exit 3 on n1" and status.ranks == {}


def test_srun_failures_keep_the_tasks_that_failed_by_themselves_first_first() -> None:
    exit3 = (TESTS / "fixtures" / "slurm" / "batchlog_rank1_exit3.txt").read_text()
    killed = (TESTS / "fixtures" / "slurm" / "batchlog_rank1_killed.txt").read_text()
    assert srun_failures(exit3) == (Failure(1, "n1", code=3),)  # the Terminated tasks are srun's doing
    assert srun_failures(killed) == (Failure(1, "n1", signal="SIGKILL"),)
    both = "srun: error: n2: tasks 2-3: Exited with exit code 200\nsrun: error: n1: task 0: Segmentation fault\n"
    assert srun_failures(both) == (Failure(2, "n2", 200), Failure(3, "n2", 200), Failure(0, "n1", signal="SIGSEGV"))


def test_in_torchrun_mode_a_failed_task_is_a_nodes_torchrun_told_by_its_node_not_as_a_rank() -> None:
    """srun's task 1 in torchrun mode is the second node's torchrun, which exits as its first
    failed worker did (dist_jobs.train.torchrun): a rank killed there, whichever rank it was."""
    killed = "srun: error: n2: task 1: Exited with exit code 137\n"
    (failure,) = srun_failures(killed, tasks_are_ranks=False)
    assert failure == Failure(None, "n2", code=137)
    verdict = decide(Evidence(137, (failure,)), restarts_left=1)
    assert (
        verdict.told()
        == "rank killed: killed by SIGKILL (exit 137) on n2; restarted in place from the latest checkpoint"
    )
