"""The hang watchdog (dist_jobs.train.watchdog): a process whose steps stop dumps every thread's
stack to its stderr and exits with the requeue code; a slow but steadily stepping one is left alone."""

from __future__ import annotations

import io
import os
import subprocess
import textwrap
import time
from pathlib import Path

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.train.watchdog import Watchdog
from support.paths import PYTHON, REPO

STALLS = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from dist_jobs.train.watchdog import Watchdog

    def helper_thread_waits():
        time.sleep(600)

    def stuck_in_a_collective():
        time.sleep(600)  # what a rank waiting for a peer that stopped stepping looks like

    marker = Path(sys.argv[1])
    threading.Thread(target=helper_thread_waits, name="loader", daemon=True).start()
    with Watchdog(3.0, 1.0, rank=1, on_fire=lambda: marker.write_text("hang")) as dog:
        for _ in range(5):
            time.sleep(0.05)
            dog.beat()
        print("stepped 5 times", flush=True)
        stuck_in_a_collective()
    print("not reached", flush=True)
    """
)


def test_a_stalled_process_dumps_every_threads_stack_and_exits_to_be_requeued(tmp_path: Path) -> None:
    marker = tmp_path / "PREEMPTED"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.run([PYTHON, "-c", STALLS, str(marker)], env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == REQUEUE_EXIT_CODE == 200, proc.stderr
    assert proc.stdout == "stepped 5 times\n"
    assert "dist-jobs: rank 1: hang watchdog: no optimizer step completed for" in proc.stderr
    assert "limit 1 s = max(3 x median step" in proc.stderr and f"exit {REQUEUE_EXIT_CODE}" in proc.stderr
    # faulthandler's dump of all threads: the stuck main thread, the helper, the watchdog itself.
    assert proc.stderr.count("Thread 0x") == 2 and "Current thread 0x" in proc.stderr, proc.stderr
    assert "in stuck_in_a_collective" in proc.stderr and "in helper_thread_waits" in proc.stderr
    assert marker.read_text() == "hang"  # what the batch script and the pod entrypoint read as "requeue"
    assert took < 30


def test_a_slow_but_stepping_run_is_left_alone() -> None:
    exits: list[int] = []
    out = io.StringIO()
    # Steps slower than the floor, slowing down, but each within factor x the median so far.
    with Watchdog(3.0, 0.3, exit=exits.append, stream=out, check_every_s=0.02) as dog:
        dog.beat()
        for pause in (0.2, 0.25, 0.35, 0.45, 0.6, 0.5, 0.4):
            time.sleep(pause)
            dog.beat()
    assert not dog.fired and exits == [] and out.getvalue() == ""
    assert 0.3 < dog.limit() < 3 * 0.6


def test_nothing_is_watched_before_the_first_step_and_evaluation_touches_it() -> None:
    exits: list[int] = []
    with Watchdog(2.0, 0.2, exit=exits.append, stream=io.StringIO(), check_every_s=0.02, linger_s=0) as dog:
        time.sleep(0.5)  # start-up, resume, compile: no step yet, nothing to compare with
        assert not dog.fired
        dog.beat()
        for _ in range(10):  # evaluation batches: progress, not steps
            time.sleep(0.1)
            dog.touch()
        assert not dog.fired
        deadline = time.monotonic() + 10
        while not dog.fired and time.monotonic() < deadline:
            time.sleep(0.02)
    assert dog.fired and exits == [REQUEUE_EXIT_CODE]


def test_the_templates_give_collectives_a_timeout_the_watchdog_beats() -> None:
    from dist_jobs.spec.env import job_env
    from dist_jobs.spec.load import load_spec

    base = {"name": "t", "nodes": 2, "procs_per_node": 2, "image": "reg.example/t:1"}
    for backend in ("slurm", "k8s", "local"):
        env = job_env(load_spec(data=base), backend)
        assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["DIST_JOBS_COLLECTIVE_TIMEOUT"]) == ("1", "600")
    tight = load_spec(data={**base, "train": {"hang_min_seconds": 45.5}})
    assert job_env(tight, "slurm")["DIST_JOBS_COLLECTIVE_TIMEOUT"] == "91"
    chosen = load_spec(data={**base, "train": {"collective_timeout": 1800, "hang_watchdog": False}})
    assert job_env(chosen, "k8s")["DIST_JOBS_COLLECTIVE_TIMEOUT"] == "1800"
    off = load_spec(data={**base, "train": {"hang_watchdog": False}})
    assert "DIST_JOBS_COLLECTIVE_TIMEOUT" not in job_env(off, "slurm")


def test_collective_timeout_prefers_the_field_then_the_template_then_twice_the_floor() -> None:
    from datetime import timedelta

    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.distributed import collective_timeout

    rdzv = timedelta(seconds=300)
    env = {"DIST_JOBS_COLLECTIVE_TIMEOUT": "900"}
    assert collective_timeout(TrainConfig(collective_timeout=42.0), rdzv, env) == timedelta(seconds=42)
    assert collective_timeout(TrainConfig(), rdzv, env) == timedelta(seconds=900)
    assert collective_timeout(TrainConfig(), rdzv, {}) == timedelta(seconds=600)  # 2 x hang_min_seconds
    assert collective_timeout(TrainConfig(hang_min_seconds=10.0), rdzv, {}) == rdzv  # never below the rendezvous
    assert collective_timeout(TrainConfig(hang_watchdog=False), rdzv, {"DIST_JOBS_COLLECTIVE_TIMEOUT": "x"}) == rdzv
