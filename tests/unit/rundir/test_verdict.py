"""dist_jobs.rundir.verdict: one verdict per attempt, from the evidence its launcher collected."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from dist_jobs.rundir.verdict import Action, Ending, Evidence, Failure, Verdict, decide, record, recorded
from support.render_helpers import run_pod_entrypoint

KILLED = Failure(3, "n2", signal="SIGKILL")
EXIT3 = Failure(1, "n1", code=3)
PEER = Failure(0, "n1", code=200)


@pytest.mark.parametrize(
    "evidence,ending,action,code",
    [
        (Evidence(0), Ending.COMPLETED, Action.DONE, 0),
        (Evidence(143, (EXIT3,)), Ending.PROGRAM_ERROR, Action.FAIL, 3),  # srun's 143 is not the cause
        (Evidence(1), Ending.PROGRAM_ERROR, Action.FAIL, 1),
        (Evidence(143, (KILLED, EXIT3)), Ending.RANK_KILLED, Action.RESTART, 200),  # the first failure decides
        (Evidence(137), Ending.RANK_KILLED, Action.RESTART, 200),
        # srun killed by its step watcher (its step had ended at SLURM): not a rank killed
        (Evidence(137, step_lost="step 973.0 ended"), Ending.PEER_LOST, Action.RESTART, 200),
        (Evidence(137, step_lost="step 973.0 ended", hang="rank 3 stopped"), Ending.HANG, Action.RESTART, 200),
        (Evidence(137, (EXIT3,), step_lost="step 973.0 ended"), Ending.PROGRAM_ERROR, Action.FAIL, 3),
        (Evidence(200, (PEER,)), Ending.PEER_LOST, Action.RESTART, 200),
        # a peer's loss heard of before its cause (torchrun mode: the killed worker's node reports
        # later): the cause decides, a bug as a rank killed
        (Evidence(200, (PEER, KILLED)), Ending.RANK_KILLED, Action.RESTART, 200),
        (Evidence(200, (PEER, EXIT3)), Ending.PROGRAM_ERROR, Action.FAIL, 3),
        (Evidence(1, (Failure(0, code=1),), peer_left="pod w-1 deleted"), Ending.PEER_LOST, Action.RESTART, 200),
        (Evidence(200, (PEER,), preempted=True), Ending.PREEMPTED, Action.REQUEUE, 200),
        (Evidence(1, (EXIT3,), warned=True), Ending.PREEMPTED, Action.REQUEUE, 200),
        (Evidence(200, (PEER,), preempted=True, hang="rank 3 stopped"), Ending.HANG, Action.RESTART, 200),
        (Evidence(143, (KILLED,), lost_nodes=("n2",)), Ending.NODE_LOST, Action.REQUEUE, 200),
        (Evidence(143, (KILLED,), cancelled=True), Ending.CANCELLED, Action.NONE, 143),
        (Evidence(143, cancelled=True, lost_nodes=("n2",)), Ending.NODE_LOST, Action.NONE, 143),  # SLURM requeues
        (Evidence(0, lock_lost=True), Ending.LOCK_LOST, Action.STOP, 6),
    ],
)
def test_each_ending_its_action_and_exit_code(evidence: Evidence, ending: Ending, action: Action, code: int) -> None:
    verdict = decide(evidence, restarts_left=1)
    assert (verdict.ending, verdict.action, verdict.exit_code) == (ending, action, code), verdict


def test_the_verdict_names_the_rank_and_node_that_failed_first() -> None:
    verdict = decide(Evidence(143, (EXIT3, KILLED)))
    assert (verdict.rank, verdict.node) == (1, "n1")
    assert (
        verdict.told()
        == "the program failed: rank 1 exit 3 on n1; failed at once (the program's own error is not retried)"
    )
    assert decide(Evidence(143, (KILLED,)), restarts_left=2).told() == (
        "rank killed: rank 3 killed by SIGKILL on n2; restarted in place from the latest checkpoint"
    )


def test_status_tells_a_failure_by_the_process_that_failed_first_and_any_other_end_by_its_exit() -> None:
    """The words `status` shows for an ended attempt on every backend (verdict.in_status)."""
    failed = decide(Evidence(143, (EXIT3, KILLED)))
    assert failed.failure == "exit 3 on n1"
    assert (
        failed.in_status()
        == "rank 1 failed first: exit 3 on n1; failed at once: the program's own error is not retried"
    )
    on_a_node = decide(Evidence(1, (Failure(None, "node 0", 1),)))  # a local torchrun: its node, no rank
    assert on_a_node.in_status() == "exit 1 on node 0; failed at once: the program's own error is not retried"
    assert decide(Evidence(143, (KILLED,)), restarts_left=0).in_status() == (
        "rank killed: rank 3 killed by SIGKILL on n2; to resume from the latest checkpoint (exit 200)"
    )
    assert decide(Evidence(0)).in_status() == "exit 0"
    older = replace(failed, failure="")  # recorded before verdicts kept the failure's words: its cause
    assert older.in_status() == "rank 1 exit 3 on n1; failed at once: the program's own error is not retried"


def test_a_cancel_blames_no_rank_the_ranks_exits_followed_it() -> None:
    """scancel or `scontrol requeue`: the trainer checkpoints and exits 200 on every rank, which is
    the cancel's doing, not a lost peer on whichever rank srun heard first."""
    verdict = decide(Evidence(143, (PEER,), cancelled=True))
    assert (verdict.ending, verdict.rank, verdict.node) == (Ending.CANCELLED, None, "")
    assert verdict.told() == "cancelled: a cancel or a requeue from outside"
    assert PEER.told() == "exit 200 (asked to run again) on n1"


def test_a_fault_without_restarts_left_gives_the_allocation_up() -> None:
    verdict = decide(Evidence(143, (KILLED,)), restarts_left=0)
    assert (verdict.ending, verdict.action) == (Ending.RANK_KILLED, Action.REQUEUE)
    assert verdict.fault_in_place and verdict.told().endswith("; to resume from the latest checkpoint")


def test_verdicts_are_recorded_per_submission_and_read_back(tmp_path: Path) -> None:
    first = Verdict(Ending.RANK_KILLED, Action.RESTART, 200, "rank 3 killed by SIGKILL on n2", 3, "n2", "0", 5.0)
    second = Verdict(Ending.COMPLETED, Action.DONE, 0, attempt="0.1", time=9.0)
    record(tmp_path, "42", first)
    record(tmp_path, "42", second)
    (tmp_path / "verdicts" / "42.jsonl").open("a").write("not json\n")
    assert recorded(tmp_path, "42") == [first, second]
    assert recorded(tmp_path, "43") == []


def test_a_verdict_a_superseded_attempt_lands_late_is_not_read_back(tmp_path: Path) -> None:
    """Attempt 0 (lock stamp a) restarted in place under the same lock, then attempt 1 (stamp b)
    took over; attempt 0's launcher, paused past its lease, lands one more verdict after attempt
    1's: a late write, left out. A verdict without a stamp (a pod that holds no token) always counts."""
    killed = Verdict(Ending.RANK_KILLED, Action.RESTART, 200, attempt="0", stamp="a" * 12)
    lost = Verdict(Ending.NODE_LOST, Action.REQUEUE, 200, attempt="0.1", stamp="a" * 12)
    done = Verdict(Ending.COMPLETED, Action.DONE, 0, attempt="1", stamp="b" * 12)
    late = Verdict(Ending.PROGRAM_ERROR, Action.FAIL, 1, attempt="0.1", stamp="a" * 12)
    pod = Verdict(Ending.PEER_LOST, Action.RESTART, 200, node="w-1")
    for verdict in (killed, lost, done, late, pod):
        record(tmp_path, "42", verdict)
    assert recorded(tmp_path, "42") == [killed, lost, done, pod]


# -- the pod entrypoint (templates/pod-entrypoint.sh), as its container runs it ---------------------

POD = {"name": "pods", "nodes": 2, "procs_per_node": 1, "image": "x/y:1", "k8s": {"namespace": "ml"}}


NOTED = """echo '{{"rank": {rank}, "code": {code}}}' > "$DIST_JOBS_FIRST_FAILURE"; """


def pod(tmp_path: Path, program: str, member: str = "pods-master-0") -> subprocess.CompletedProcess[str]:
    return run_pod_entrypoint(POD, program, tmp_path / "shared", {"HOSTNAME": member, "PET_NODE_RANK": "1"})


@pytest.mark.parametrize(
    "program,code,told",
    [
        ("exit 0", 0, "completed"),
        ("exit 3", 3, "the program failed: exit 3 on pods-master-0; failed at once"),
        ("kill -KILL $$", 200, "rank killed: killed by SIGKILL (exit 137) on pods-master-0"),
        # torchrun (dist_jobs.train.torchrun) notes its first failed worker's global rank where the
        # entrypoint asks: the verdict names it; a note of another exit code is not this program's
        (NOTED.format(rank=3, code=137) + "exit 137", 200, "rank killed: rank 3 killed by SIGKILL (exit 137) on pods"),
        (NOTED.format(rank=3, code=137) + "exit 1", 1, "the program failed: exit 1 on pods-master-0"),
        ('touch "$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN/PREEMPTED"; exit 200', 200, "preempted"),
    ],
)
def test_a_pods_end_is_the_verdicts(tmp_path: Path, program: str, code: int, told: str) -> None:
    """200 is what restartPolicy ExitCode retries; the program's own error (1-127) is permanent."""
    proc = pod(tmp_path, program)
    assert proc.returncode == code, proc.stderr
    assert f"dist-jobs: pods-master-0: {told}" in proc.stderr


def test_a_users_program_that_fails_once_a_peer_pod_was_told_to_stop_lost_a_peer(tmp_path: Path) -> None:
    """A worker pod is deleted (its entrypoint gets SIGTERM and says so in the run directory); the
    master's program, a user's script, then fails with its own exit 1 (gloo's "Connection reset
    by peer"): a lost peer, retried, not the user's bug."""
    worker = pod(tmp_path, "kill -TERM $PPID; sleep 5; exit 143", member="pods-worker-0")
    assert worker.returncode == 200, worker.stderr  # the deleted pod itself was told to stop: retried
    note = tmp_path / "shared" / "pods" / "peers" / "pods-worker-0"
    assert note.is_file()
    proc = pod(tmp_path, "exit 1")  # a peer that left before this program started is not its loss
    assert proc.returncode == 1, proc.stderr
    proc = pod(tmp_path, f"touch '{note}'; exit 1")  # the worker told to stop while the program ran
    assert proc.returncode == 200, proc.stderr
    assert "peer lost: pods-worker-0 stopped while the program ran" in proc.stderr


def test_a_run_that_lost_its_lock_records_nothing_in_the_other_runs_directory(tmp_path: Path) -> None:
    record(tmp_path, "42", decide(Evidence(137, lock_lost=True)))
    assert not (tmp_path / "verdicts").exists()
