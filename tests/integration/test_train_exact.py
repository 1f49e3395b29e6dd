"""Interrupted and resumed training ends bit-identical to an uninterrupted run (2 ranks, gloo, CPU).

Three runs of the same job: uninterrupted; stopped by SIGUSR1 to one rank at a random step and
resumed (hand-made env:// launch); one rank SIGKILLed after a checkpoint, the job torn down by
torchrun, and resumed from that checkpoint. The final model and optimizer state of the three
must be equal tensor for tensor. The model uses BatchNorm and dropout and the data a random
flip (tests/support/workloads.py), so RNG, buffers, momentum and the sampler position all
have to come back exactly. The random step is printed, so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dist_jobs.constants import REQUEUE_EXIT_CODE
from support.tiers import requires
from support.train_support import (
    Launch,
    assert_bit_identical,
    final_state,
    kill_all,
    preempted_why,
    rank_of,
    start_ranks,
    start_torchrun,
    wait_all,
)
from support.waiting import HUNG_S, eventually

# Its tests share one module-scoped reference run: one xdist worker runs them all.
pytestmark = [requires("torch"), pytest.mark.timeout(240), pytest.mark.xdist_group("test_train_exact")]

EVERY = 5  # checkpoint interval in steps
TOTAL = 18  # 96 samples / 2 ranks / batch 4 / grad_accum 2 = 6 steps per epoch, 3 epochs
DELAY = {"DJ_TEST_STEP_DELAY": "0.15"}  # per forward (2 a step): time to aim, same numbers


def job(checkpoints: Path) -> list[str]:
    return [
        "--model",
        "support.workloads:tiny_net",
        "--data",
        "support.workloads:tiny_data",
        "--image-size",
        "8",
        "--fake-samples",
        "96",
        "--batch-size",
        "4",
        "--grad-accum",
        "2",
        "--epochs",
        "3",
        "--deterministic",
        "--workers",
        "0",
        "--seed",
        "3",
        "--log-every",
        "1",
        "--no-progress",
        "--lr",
        "0.05",
        "--warmup-steps",
        "2",
        "--checkpoint-every-steps",
        str(EVERY),
        "--checkpoint-dir",
        str(checkpoints),
        "--run-name",
        "exact",
    ]


def wait_for(what: str, ready: Callable[[], object], launches: list[Launch], timeout: float = 90) -> None:
    """Poll `ready()`; once the deadline passes or a launch has exited, kill them all and fail with their logs."""
    eventually(
        ready,
        timeout=timeout,
        interval=0.02,
        what=what,
        give_up=lambda: [launch.proc.returncode for launch in launches if launch.proc.poll() is not None],
        on_timeout=lambda: kill_all(launches),
        context=lambda: "\n".join(launch.text()[-2000:] for launch in launches),
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("reference")
    codes = wait_all(start_ranks(job(root / "ckpt"), root), timeout=120)
    assert codes == [0, 0], (root / "rank0.log").read_text()[-3000:]
    state = final_state(root / "ckpt" / "exact")
    assert state["step"] == TOTAL and state["epoch"] == 3
    return state


def test_preempted_by_signal_then_resumed_is_bit_identical(reference: dict, tmp_path: Path) -> None:
    rng = random.Random()
    stop_at, target = rng.randint(2, TOTAL - 7), rng.randint(0, 1)
    print(f"SIGUSR1 to rank {target} once rank 0 logged step {stop_at}")
    run_dir = tmp_path / "ckpt" / "exact"
    ranks = start_ranks(job(tmp_path / "ckpt"), tmp_path, **DELAY)
    wait_for(f"step {stop_at}", lambda: ranks[0].last_step() >= stop_at, ranks)
    ranks[target].proc.send_signal(signal.SIGUSR1)
    codes = wait_all(ranks, timeout=60)
    assert codes == [REQUEUE_EXIT_CODE] * 2, ranks[0].text()[-3000:]
    assert "preempted by" in ranks[target].text() and "Traceback" not in ranks[0].text()
    marker = int(preempted_why(run_dir))
    assert stop_at < marker < TOTAL, f"checkpointed at step {marker}"
    assert (run_dir / f"step-{marker}" / "COMPLETE").is_file()

    (tmp_path / "resumed").mkdir()
    resumed = start_ranks(job(tmp_path / "ckpt"), tmp_path / "resumed")
    assert wait_all(resumed, timeout=120) == [0, 0], resumed[0].text()[-3000:]
    assert f"resumed from {run_dir / f'step-{marker}'}" in resumed[0].text()
    assert not (run_dir / "PREEMPTED").exists()
    final = final_state(run_dir)
    assert_bit_identical(final["model"], reference["model"], "model")
    assert_bit_identical(final["optimizer"], reference["optimizer"], "optimizer")
    assert_bit_identical(final["scheduler"], reference["scheduler"], "scheduler")


def test_rank_killed_then_resumed_from_last_checkpoint_is_bit_identical(reference: dict, tmp_path: Path) -> None:
    kill_at = random.Random().randint(EVERY + 1, 2 * EVERY - 3)
    print(f"SIGKILL to rank 1 once rank 0 logged step {kill_at}")
    run_dir = tmp_path / "ckpt" / "exact"
    job_run = start_torchrun(job(tmp_path / "ckpt"), tmp_path / "torchrun.log", **DELAY)
    wait_for(f"step {kill_at}", lambda: job_run.last_step() >= kill_at, [job_run])
    assert (run_dir / f"step-{EVERY}" / "COMPLETE").is_file()
    victims = [pid for pid in job_run.tree() if rank_of(pid) == 1]
    assert len(victims) == 1, job_run.tree()
    killed = time.monotonic()
    os.kill(victims[0], signal.SIGKILL)
    code = job_run.wait(timeout=HUNG_S)  # the survivor must not hang: gloo errors, torchrun tears down
    print(f"torchrun exited {code} {time.monotonic() - killed:.1f} s after the kill")
    assert code != 0
    assert not (run_dir / "PREEMPTED").exists()
    # Normally step-5; step-10 only if rank 1 had written its part before it died.
    newest = max(int(p.name[5:]) for p in run_dir.glob("step-*"))
    assert EVERY <= newest < TOTAL

    resumed = start_torchrun(job(tmp_path / "ckpt"), tmp_path / "resumed.log")
    assert resumed.wait(timeout=HUNG_S) == 0, resumed.text()[-3000:]
    resumed.kill()
    assert f"resumed from {run_dir / f'step-{newest}'}" in resumed.text()
    final = final_state(run_dir)
    assert_bit_identical(final["model"], reference["model"], "model")
    assert_bit_identical(final["optimizer"], reference["optimizer"], "optimizer")
