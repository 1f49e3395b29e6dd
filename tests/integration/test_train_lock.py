"""The trainer's own side of the run directory lock, for launches nothing else locked (a hand-made
env:// or torchrun launch, submitit, a script calling fit()): rank 0 takes the lock before the
first checkpoint is touched, a second launch into the same run directory ends with exit code 2
on every rank (not a peer left waiting in a collective), and the lock is gone when the run ends."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dist_jobs.rundir.holder import Holder
from support.lock_support import foreign, take_over
from support.tiers import requires
from support.train_support import start_ranks, wait_all
from support.waiting import eventually

pytestmark = [requires("torch"), pytest.mark.timeout(240)]


def job(checkpoints: Path) -> list[str]:
    return [
        *("--model", "support.workloads:tiny_net", "--data", "support.workloads:tiny_data"),
        *("--image-size", "8", "--fake-samples", "256", "--batch-size", "4", "--epochs", "2"),
        *("--workers", "0", "--log-every", "1", "--no-progress", "--checkpoint-every-steps", "4"),
        *("--checkpoint-dir", str(checkpoints), "--run-name", "locked"),
    ]


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def mtimes(folder: Path) -> dict[str, float]:
    """Each entry's mtime; one renamed away between the listing and its stat (a writer's
    temporary file) is left out."""
    found = {}
    for path in folder.iterdir():
        try:
            found[path.name] = path.stat().st_mtime
        except FileNotFoundError:
            continue
    return found


def test_a_hand_launch_holds_the_lock_and_a_second_one_is_refused_on_every_rank(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lock = tmp_path / "ckpt" / "locked" / "LOCK"
    first = start_ranks(job(tmp_path / "ckpt"), tmp_path / "a", DJ_TEST_STEP_DELAY="0.3")
    try:
        eventually(
            lambda: first[0].last_step() >= 1,
            timeout=90,
            interval=0.05,
            what="the first run's step 1",
            give_up=lambda: [r.proc.returncode for r in first if r.proc.poll() is not None],
            context=lambda: first[0].text()[-3000:],
        )
        held = json.loads(lock.read_text())
        assert (held["pid"], held["backend"], held["owner"]) == (first[0].proc.pid, "trainer", "")

        second = start_ranks(job(tmp_path / "ckpt"), tmp_path / "b")
        assert wait_all(second, timeout=120) == [2, 2], second[0].text()[-3000:]
        refusal = second[0].text()
        assert f"is in use by another run (trainer run, pid {first[0].proc.pid} on host " in refusal, refusal
        assert "rank 0 was refused the lock" in second[1].text() and "Traceback" not in refusal
        # the first run goes on (on a loaded machine it may have ended by now, and well)
        assert all(r.proc.poll() in (None, 0) for r in first), first[0].text()[-3000:]
    finally:
        codes = wait_all(first, timeout=150)
    assert codes == [0, 0], first[0].text()[-3000:]
    assert not lock.exists()


def test_a_run_whose_lock_is_taken_over_stops_and_writes_nothing_more(tmp_path: Path) -> None:
    """Another run takes the lock over mid-run (as it would after this one was paused past the
    stale limit): from that moment no rank writes into the run directory (metrics, progress,
    checkpoints, result), every rank exits 6 at the next step boundary, and rank 0 names the
    new holder. The other run's lock stays."""
    (tmp_path / "a").mkdir()
    run_dir = tmp_path / "ckpt" / "locked"
    args = [*job(tmp_path / "ckpt"), "--checkpoint-every-steps", "2"]
    ranks = start_ranks(args, tmp_path / "a", DJ_TEST_STEP_DELAY="0.5", DIST_JOBS_LOCK_HEARTBEAT_SECONDS="0.2")
    try:
        # step-2 committed and tidied: `latest`, first written by the pruner thread after the
        # commit, must not be a file this run creates after the takeover.
        eventually(
            lambda: read(run_dir / "latest"),
            until=lambda latest: latest == "step-2\n",
            timeout=90,
            interval=0.05,
            what="`latest` naming step-2",
            give_up=lambda: [r.proc.returncode for r in ranks if r.proc.poll() is not None],
            context=lambda: ranks[0].text()[-3000:],
        )
        thief = foreign("slurm:4300", "slurm", "4300")
        take_over(run_dir, thief)  # the takeover: from now on the folder is 4300's
        taken = time.time()
        before = mtimes(run_dir)
    finally:
        codes = wait_all(ranks, timeout=120)
    assert codes == [6, 6], ranks[0].text()[-3000:]
    log = ranks[0].text()
    assert "lost the lock of run directory" in log and "slurm job 4300, pid 99999 on host elsewhere" in log, log
    assert "Traceback" not in log and "Traceback" not in ranks[1].text()
    after = mtimes(run_dir)
    # A write that passed its check just before the takeover may land a moment after it; none later.
    changed = {name for name, mtime in after.items() if mtime > taken + 0.3 or name not in before}
    assert changed == set(), changed
    assert not (run_dir / "result.json").exists()
    assert Holder.parse((run_dir / "LOCK").read_bytes()) == thief
