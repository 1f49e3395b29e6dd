"""A pod's verdict (rundir.pod_end) reads the PREEMPTED marker and the HANG record of pod rank 0's
lock only (DIST_JOBS_LOCK_TOKEN): another holder's late one does not make the program preempted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dist_jobs.rundir import pod_end
from dist_jobs.rundir.hang import HangRecord, write_hang, write_preempted
from dist_jobs.rundir.lock import new_token, stamp_of
from dist_jobs.rundir.verdict import recorded


def test_a_late_marker_of_another_holder_is_not_this_pods_preemption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, token = tmp_path / "ckpt" / "run", new_token()
    run_dir.mkdir(parents=True)
    for name, value in {"DIST_JOBS_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "DIST_JOBS_RUN": "run"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DIST_JOBS_SUBMISSION", "pods")
    monkeypatch.setenv("DIST_JOBS_LOCK_TOKEN", token)
    monkeypatch.delenv("DIST_JOBS_LOCK_OWNER", raising=False)
    (tmp_path / "start").touch()
    since = (tmp_path / "start").stat().st_mtime
    old = stamp_of(new_token())
    write_preempted(run_dir, "12", old)
    os.utime(run_dir / "PREEMPTED", (since + 1, since + 1))
    write_hang(run_dir, HangRecord(rank=1, step=12, time=since + 1, stamp=old))
    pod_end.main(["--rc", "1", "--since", str(tmp_path / "start")])
    assert capsys.readouterr().out.strip() == "1"  # the program's own error, not a requeue
    assert recorded(run_dir, "pods")[-1].ending.value not in ("preempted", "hang")
    write_preempted(run_dir, "14", stamp_of(token))
    os.utime(run_dir / "PREEMPTED", (since + 2, since + 2))
    pod_end.main(["--rc", "200", "--since", str(tmp_path / "start")])
    assert capsys.readouterr().out.strip() == "200" and recorded(run_dir, "pods")[-1].ending.value == "preempted"


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pod w-0 of a 2-pod job, its program started at tmp_path/start: its run directory."""
    run_dir = tmp_path / "ckpt" / "run"
    run_dir.mkdir(parents=True)
    env = {"DIST_JOBS_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "DIST_JOBS_RUN": "run", "DIST_JOBS_SUBMISSION": "s"}
    for name, value in {**env, "HOSTNAME": "w-0", "PET_NNODES": "2", "DIST_JOBS_MAX_RESTARTS": "3"}.items():
        monkeypatch.setenv(name, value)
    for name in ("DIST_JOBS_LOCK_TOKEN", "DIST_JOBS_LOCK_OWNER", "DIST_JOBS_NODE", "DIST_JOBS_K8S_JOB"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "start").touch()
    return run_dir


def end(tmp_path: Path, rc: int, capsys: pytest.CaptureFixture[str]) -> int:
    pod_end.main(["--rc", str(rc), "--since", str(tmp_path / "start")])
    return int(capsys.readouterr().out.strip())


def test_a_users_program_that_failed_waits_for_the_note_of_the_peer_whose_fault_came_first(
    tmp_path: Path, pod: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """w-0's script dies of "Connection reset by peer" (exit 1) because a rank of w-1 was SIGKILLed;
    w-1's note comes once w-1's own program has ended, while w-0 waits for it: a lost peer, retried."""
    waits: list[float] = []

    def peer_ends(seconds: float) -> None:  # w-1's entrypoint ends as w-0 starts waiting
        waits.append(seconds)
        (pod / "peers").mkdir(exist_ok=True)
        (pod / "peers" / "w-1").touch()

    monkeypatch.setattr(pod_end.time, "sleep", peer_ends)
    assert end(tmp_path, 1, capsys) == 200
    (verdict,) = recorded(pod, "s")
    assert (verdict.ending.value, verdict.cause) == ("peer lost", "w-1 stopped while the program ran")
    assert len(waits) == 1 and not (pod / "peers" / "w-0").exists()  # a lost peer leaves no note of its own


def test_a_bug_on_every_pod_fails_once_the_wait_for_a_peers_note_is_over(
    tmp_path: Path, pod: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DIST_JOBS_PEER_WORD_SECONDS", "0.3")
    assert end(tmp_path, 1, capsys) == 1
    assert recorded(pod, "s")[-1].ending.value == "program error"
    assert not (pod / "peers").exists()  # a bug leaves no note: the peers' failures stay their own
    monkeypatch.setenv("PET_NNODES", "1")  # no peers: no wait
    monkeypatch.setenv("DIST_JOBS_PEER_WORD_SECONDS", "600")
    assert end(tmp_path, 3, capsys) == 3


def test_a_pod_whose_rank_was_killed_leaves_its_peers_a_note(
    tmp_path: Path, pod: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert end(tmp_path, 137, capsys) == 200  # torchrun's first failed worker: SIGKILL
    assert recorded(pod, "s")[-1].ending.value == "rank killed"
    assert (pod / "peers" / "w-0").stat().st_mtime >= (tmp_path / "start").stat().st_mtime
