"""dist_jobs.rundir.quarantine: the nodes a job keeps away from its next attempts, and the
batch script's side of it (dist_jobs.backends.slurm.step_end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_jobs.backends.slurm.nodecheck import NONCE_FILE, check, parse_reports
from dist_jobs.backends.slurm.step_end import before_step, excluded_now, judge, quarantine, silent_nodes, unfit_nodes
from dist_jobs.rundir.quarantine import (
    QUARANTINE,
    Quarantine,
    active_quarantines,
    blamed_nodes,
    exclusion,
    keep_away,
    kept_away,
)
from dist_jobs.rundir.verdict import Action, Ending, Evidence, Failure, Verdict, decide

NODE_LOST = decide(Evidence(143, (Failure(3, "n2", signal="SIGKILL"),), lost_nodes=("n2", "n3")))
KILLED_USED_UP = decide(Evidence(137, (Failure(3, "n2", signal="SIGKILL"),)), restarts_left=0)
KILLED_RESTART = decide(Evidence(137, (Failure(3, "n2", signal="SIGKILL"),)), restarts_left=1)
PREEMPTED = decide(Evidence(200, preempted=True))


@pytest.mark.parametrize(
    "verdict,nodes",
    [(NODE_LOST, ("n2", "n3")), (KILLED_USED_UP, ("n2",)), (KILLED_RESTART, ()), (PREEMPTED, ())],
)
def test_the_verdict_blames_lost_nodes_and_the_node_of_a_killed_rank_given_up_on(
    verdict: Verdict, nodes: tuple[str, ...]
) -> None:
    assert blamed_nodes(verdict) == nodes


def test_a_node_kept_away_is_recorded_with_why_and_until_when(tmp_path: Path) -> None:
    keep_away(tmp_path, "7", NODE_LOST, now=1000.0, seconds=60)
    keep_away(tmp_path, "8", KILLED_USED_UP, now=1000.0)  # another job of the run
    assert kept_away(tmp_path, "7") == [
        Quarantine("n2", "n2, n3 no longer answered", "7", 1000.0, 1060.0),
        Quarantine("n3", "n2, n3 no longer answered", "7", 1000.0, 1060.0),
    ]
    assert [q.node for q in kept_away(tmp_path, "8")] == ["n2"]
    assert kept_away(tmp_path / "missing", "7") == []


def test_a_torn_line_is_skipped_and_the_latest_record_of_a_node_wins(tmp_path: Path) -> None:
    keep_away(tmp_path, "7", NODE_LOST, now=1000.0, seconds=60)
    with open(tmp_path / QUARANTINE, "a") as fh:
        fh.write('{"node": "n9", "time": 1\n')  # its writer died mid-line
    keep_away(tmp_path, "7", KILLED_USED_UP, now=2000.0, seconds=60)
    found = kept_away(tmp_path, "7")
    assert [(q.node, q.until) for q in found] == [("n3", 1060.0), ("n2", 2060.0)]
    assert [q.active(1500.0) for q in found] == [False, True]


def test_the_exclusion_keeps_the_users_own_adds_the_active_and_drops_the_expired() -> None:
    records = [Quarantine("n2", "lost", "7", 0.0, 100.0), Quarantine("n3", "lost", "7", 0.0, 10.0)]
    assert exclusion(["gpu7", "n3"], records, now=50.0) == ["gpu7", "n2"]
    assert exclusion([], records, now=5.0) == ["n2", "n3"]
    assert exclusion(["n2"], records, now=500.0) == []


def test_scontrol_show_jobs_exclusion_is_read() -> None:
    assert excluded_now("JobId=7 JobName=x ReqNodeList=(null) ExcNodeList=n[2-3] NodeList=n1") == ["n2", "n3"]
    assert excluded_now("JobId=7 ExcNodeList=(null) NodeList=n1") == []
    assert excluded_now("") == []


def test_before_a_requeue_the_blamed_node_is_kept_away_and_the_whole_exclusion_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert quarantine(tmp_path, "7", NODE_LOST, current=lambda job: ["gpu7"]) == "gpu7,n2,n3"
    assert "the next attempt keeps away from n2 (n2, n3 no longer answered; until " in capsys.readouterr().err
    # a later requeue for another reason still gives the exclusion: the quarantine stands
    assert quarantine(tmp_path, "7", PREEMPTED, current=lambda job: ["gpu7", "n2", "n3"]) == "gpu7,n2,n3"
    assert capsys.readouterr().err == ""


def test_no_quarantine_no_change_and_an_expired_one_clears(tmp_path: Path) -> None:
    assert quarantine(tmp_path, "7", PREEMPTED, current=lambda job: ["gpu7"]) == ""
    assert quarantine(tmp_path, "7", KILLED_RESTART, current=lambda job: []) == ""  # no requeue: nothing
    keep_away(tmp_path, "7", NODE_LOST, now=0.0, seconds=1)  # long expired
    assert quarantine(tmp_path, "7", PREEMPTED, current=lambda job: ["n2", "n3"]) == "none"
    assert Action.REQUEUE is PREEMPTED.action


def test_when_slurm_requeues_the_job_itself_sinfo_names_the_failed_node(tmp_path: Path) -> None:
    """SLURM declared n2 down and requeued the job: the batch shell got SIGTERM (a cancel to it),
    and the probe's srun can no longer run; sinfo says which node failed."""
    cancelled = Evidence(143, cancelled=True)
    no_probe = lambda nodes: pytest.fail("no srun probe once the job is requeued")
    verdict = judge(cancelled, ["n1", "n2"], 1, probe=no_probe, failed=lambda nodes: ["n2"])
    assert (verdict.ending, verdict.action, verdict.node) == (Ending.NODE_LOST, Action.NONE, "n2")
    assert quarantine(tmp_path, "7", verdict, current=lambda job: []) == "n2"
    plain = judge(cancelled, ["n1", "n2"], 1, probe=no_probe, failed=lambda nodes: [])  # an scancel
    assert plain.ending is Ending.CANCELLED and quarantine(tmp_path, "8", plain, current=lambda job: []) == ""


def test_the_batch_host_answers_and_a_probe_that_reached_nobody_asks_sinfo() -> None:
    """srun cannot start the probe's step while a node of the allocation is dead: it reaches no
    node. The batch host runs the verdict itself, so it is never the lost node."""
    nobody = lambda nodes: []
    assert silent_nodes(["n1", "n2"], [], failed=lambda nodes: ["n2"], here="n1") == ("n2",)
    assert silent_nodes(["n1", "n2"], [], failed=lambda nodes: [], here="n1") == ("n2",)
    assert silent_nodes(["n1", "n2", "n3"], ["n1", "n3"], failed=nobody, here="n1") == ("n2",)
    assert silent_nodes(["n1", "n2"], ["n1", "n2"], failed=nobody, here="n1") == ()


def test_a_node_kept_away_but_handed_back_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """SLURM requeued the job itself (a node failed) while the batch host still cleaned up, so the
    exclusion never landed and the flapped node came back in the next allocation: the check before
    the step refuses it without probing, its record keeps its expiry, and the script's requeue
    excludes it again. An expired quarantine no longer counts."""
    keep_away(tmp_path, "7", NODE_LOST, now=1000.0, seconds=10**10)  # active until long after today
    kept = active_quarantines(tmp_path, "7", now=2000.0)

    def no_probe(nodes: list[str]) -> dict[str, str]:
        raise AssertionError("a node kept away needs no probe")

    held = before_step(["n1", "n2"], no_probe, failed=lambda nodes: [], kept=kept)
    assert held is not None and (held.ending, held.action, held.node) == (Ending.NODE_UNFIT, Action.REQUEUE, "n2")
    assert "n2 is kept away from this job (n2, n3 no longer answered)" in held.told()
    assert quarantine(tmp_path, "7", held, current=lambda job: [], in_service=lambda: ["n1", "n2", "n3", "n4"]) == (
        "n2,n3"
    )
    assert kept_away(tmp_path, "7") == kept  # not kept away an hour more for coming back
    assert active_quarantines(tmp_path, "7", now=1000.0 + 10**10) == []  # expired: no longer counts
    assert before_step(["n1", "n2"], lambda nodes: {"n1": "", "n2": ""}, failed=lambda nodes: [], kept=[]) is None


UNFIT = "its /ck/run is not the directory the batch host sees (no shared filesystem mounted there, or a stale mount)"


def test_a_node_that_answers_but_fails_its_check_is_unfit_before_the_step_and_before_a_restart() -> None:
    """The node check's answers: before the step, an unfit node ends the attempt (requeue, the
    node kept away); after a killed rank, it turns the restart in place into that requeue."""
    reports = {"n1": "", "n2": UNFIT}
    before = before_step(["n1", "n2"], lambda nodes: reports, failed=lambda nodes: [])
    assert before is not None and (before.ending, before.action, before.node) == (
        Ending.NODE_UNFIT,
        Action.REQUEUE,
        "n2",
    )
    assert before.told() == f"node unfit: n2 {UNFIT}; to resume from the latest checkpoint"
    assert blamed_nodes(before) == ("n2",)
    assert before_step(["n1", "n2"], lambda nodes: {"n1": "", "n2": ""}, failed=lambda nodes: []) is None
    # A probe that reached nobody, sinfo naming no failed node: the check itself failed, the step will tell.
    assert before_step(["n1", "n2"], lambda nodes: {}, failed=lambda nodes: []) is None
    asked: list[list[str]] = []  # a probe that reached nobody asks sinfo once, and blames what it names
    lost = before_step(["n1", "n2"], lambda nodes: {}, failed=lambda nodes: asked.append(nodes) or ["n2"])
    assert lost is not None and (lost.ending, lost.node) == (Ending.NODE_LOST, "n2") and len(asked) == 1
    killed = Evidence(137, (Failure(3, "n2", signal="SIGKILL"),))
    after = judge(killed, ["n1", "n2"], 1, probe=lambda nodes: reports, failed=lambda nodes: [])
    assert (after.ending, after.action, after.node) == (Ending.NODE_UNFIT, Action.REQUEUE, "n2")
    fine = judge(killed, ["n1", "n2"], 1, probe=lambda nodes: {"n1": "", "n2": ""}, failed=lambda nodes: [])
    assert (fine.ending, fine.action) == (Ending.RANK_KILLED, Action.RESTART)


def test_a_program_error_on_a_node_that_fails_the_node_check_is_the_nodes_not_a_bug() -> None:
    """Rank 2 on n2 exits 1 because n2 lost the run directory: the node check names n2, and the
    job is requeued without it. The same error with every node fit, or with n2 merely slow to
    answer, is the program's: it fails at once."""
    error = Evidence(1, (Failure(2, "n2", code=1),))
    blamed = judge(error, ["n1", "n2"], 1, probe=lambda nodes: {"n1": "", "n2": UNFIT}, failed=lambda nodes: [])
    assert (blamed.ending, blamed.action, blamed.node) == (Ending.NODE_UNFIT, Action.REQUEUE, "n2")
    for reports in ({"n1": "", "n2": ""}, {"n1": ""}):
        bug = judge(error, ["n1", "n2"], 1, probe=lambda nodes, r=reports: r, failed=lambda nodes: ["n2"])
        assert (bug.ending, bug.action, bug.exit_code) == (Ending.PROGRAM_ERROR, Action.FAIL, 1)


def test_the_node_check_reads_the_batch_hosts_nonce_and_writes_in_the_run_directory(tmp_path: Path) -> None:
    """A node whose run directory is another (its shared filesystem not mounted) has no nonce, or
    another one; one where it cannot write says so; the batch script reads one line per node."""
    assert check(tmp_path, "abc", host="n2").startswith(f"its {tmp_path} is not the directory the batch host sees")
    (tmp_path / NONCE_FILE).write_text("abd\n")
    assert "is not the directory the batch host sees" in check(tmp_path, "abc", host="n2")
    (tmp_path / NONCE_FILE).write_text("abc\n")
    assert check(tmp_path, "abc", host="n2") == ""
    assert list(tmp_path.iterdir()) == [tmp_path / NONCE_FILE]  # its own file is gone again
    assert parse_reports(f"n1\tok\nsrun: warning\nn2\t{UNFIT}\n") == {"n1": "", "n2": UNFIT}


def test_when_most_nodes_miss_the_batch_hosts_nonce_the_batch_host_is_the_one_kept_away() -> None:
    """The batch host (n1) wrote the nonce into a run directory only it sees (its own mount is
    missing): on 3 nodes the two that miss it outnumber it, so n1 is blamed, not them. A tie (2
    nodes) still blames the other node; a node that sees the nonce sides with the batch host."""
    blind = UNFIT
    assert unfit_nodes({"n1": "", "n2": blind, "n3": blind}, here="n1") == (
        ("n1", "its run directory is not the one 2 of the job's 3 nodes share"),
    )
    assert unfit_nodes({"n1": "", "n2": blind}, here="n1") == (("n2", blind),)
    assert unfit_nodes({"n1": "", "n2": blind, "n3": ""}, here="n1") == (("n2", blind),)
    assert unfit_nodes({"n1": "", "n2": blind, "n3": blind, "n4": "no GPU"}, here="n1") == (
        ("n2", blind),
        ("n3", blind),
        ("n4", "no GPU"),
    )
    assert unfit_nodes({"n1": "", "n2": blind, "n3": blind, "n4": blind, "n5": "no GPU"}, here="n1") == (
        ("n1", "its run directory is not the one 3 of the job's 5 nodes share"),
        ("n5", "its run directory is not the one 3 of the job's 5 nodes share; no GPU"),
    )


def test_a_gpu_job_lists_its_gpus_on_each_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi -L listing fewer GPUs than the job asks for (or failing: a GPU that fell off the
    bus) makes the node unfit; a node without nvidia-smi is not judged by it."""
    (tmp_path / NONCE_FILE).write_text("abc\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert check(tmp_path, "abc", gpus=1, host="n1") == ""
    assert (
        check(tmp_path, "abc", gpus=2, host="n1")
        == "nvidia-smi -L lists 1 of the 2 GPUs the job asks for (GPU 0: NVIDIA H100 (UUID: GPU-1))"
    )
    smi.write_text("#!/bin/sh\necho 'Unable to determine the device handle for GPU0: Unknown Error' >&2\nexit 15\n")
    assert "lists 0 of the 1 GPUs the job asks for (Unable to determine the device handle" in check(
        tmp_path, "abc", 1, "n1"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert check(tmp_path, "abc", gpus=8, host="n1") == ""


def test_a_node_is_not_kept_away_when_too_few_others_could_run_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 2-node job on a partition of 2: excluding the failed node would leave it pending forever."""
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert quarantine(tmp_path, "7", KILLED_USED_UP, current=lambda job: [], in_service=lambda: ["n1", "n2"]) == ""
    assert "n2 not kept away: the job needs 2 nodes and only 1 other can run it" in capsys.readouterr().err
    assert kept_away(tmp_path, "7") == []
    spare = lambda: ["n1", "n2", "n3"]
    assert quarantine(tmp_path, "7", KILLED_USED_UP, current=lambda job: [], in_service=spare) == "n2"
