"""`dist-jobs run --backend local` with the real training, stopped the way a scheduler, `timeout`
or systemd stops it: SIGTERM to the launcher. Every rank checkpoints at its next step boundary,
the launcher exits 200 last, and the same command run again resumes from that checkpoint and ends
bit-identical to an uninterrupted run. In srun and torchrun mode, and on a loaded machine: two
busy processes run beside the interrupted and the resumed run (the model and data are
tests/support/workloads.py's, which draw from every RNG while training).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.constants import REQUEUE_EXIT_CODE
from support.paths import PYTHON, REPO, TESTS
from support.specs import tiny_train
from support.tiers import requires
from support.train_support import assert_bit_identical, final_state, preempted_why
from support.waiting import HUNG_S, eventually

# Its tests share one module-scoped reference run: one xdist worker runs them all.
pytestmark = [
    requires("torch"),
    pytest.mark.slow,
    pytest.mark.timeout(420),
    pytest.mark.xdist_group("test_local_preemption"),
]

TOTAL = 32  # 128 samples / (2 ranks x batch 4) = 16 steps an epoch, 2 epochs
TRAIN = tiny_train(fake_samples=128, epochs=2, deterministic=True, seed=5, checkpoint_every_steps=4)
STEP = re.compile(r"step (\d+)/\d+ epoch")


def command(launcher: str) -> list[str]:
    sets = [arg for key, value in TRAIN.items() for arg in ("--set", f"train.{key}={value}")]
    return [
        *(PYTHON, "-m", "dist_jobs", "run", "--backend", "local", "--nodes", "1", "--procs-per-node", "2"),
        *("--launcher", launcher, "--name", "exact", "--checkpoint-dir", "ckpt"),
        *("--set", "preemption.grace_seconds=120", *sets),
    ]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "OMP_NUM_THREADS": "1", **extra}


@contextmanager
def busy(count: int = 2) -> Iterator[None]:
    """`count` processes spinning on the CPU for as long as the block runs."""
    spinners = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("reference")
    proc = subprocess.run(command("srun"), cwd=root, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    state = final_state(root / "ckpt" / "exact")
    assert state["step"] == TOTAL
    return state


def carrying(marker: str) -> list[int]:
    """The pids of the processes whose environment holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def stop_at(proc: subprocess.Popen[str], step: int, sig: signal.Signals = signal.SIGTERM) -> list[str]:
    """Read the launcher's output until rank 0 logged `step`; then send the launcher `sig`."""
    assert proc.stdout is not None
    lines: list[str] = []
    while True:
        line = proc.stdout.readline()
        assert line, f"the run ended before step {step}:\n" + "".join(lines[-50:])
        lines.append(line)
        logged = STEP.search(line)
        if logged and int(logged.group(1)) >= step:
            break
    proc.send_signal(sig)
    return lines


def committed(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run_dir.glob("step-*") if (p / "COMPLETE").exists())


@pytest.mark.parametrize("launcher,seen", [("srun", "SIGUSR1"), ("torchrun", "SIGTERM")])
def test_sigterm_to_the_launcher_checkpoints_and_the_rerun_is_bit_identical(
    reference: dict[str, Any], tmp_path: Path, launcher: str, seen: str
) -> None:
    """Slow by nature: the run goes twice (interrupted beside busy processes, slowed to 0.2 s a step to aim the
    signal, then resumed to the end)."""
    run_dir = tmp_path / "ckpt" / "exact"
    with busy(2):
        slowed = env(DJ_TEST_STEP_DELAY="0.2")  # time to aim; the numbers are the same
        proc = subprocess.Popen(
            command(launcher), cwd=tmp_path, env=slowed, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            lines = stop_at(proc, 6)
            out, _ = proc.communicate(timeout=HUNG_S)
        finally:
            proc.kill()
        text = "".join(lines) + out
        assert proc.returncode == REQUEUE_EXIT_CODE, text[-4000:]
        assert "dist-jobs: got SIGTERM: sending" in text and "dist-jobs: exit code 200: preempted" in text
        stopped = re.search(rf"preempted by {seen} at step (\d+): checkpoint step-\1 in \S+ is committed", text)
        assert stopped, text[-4000:]
        step = int(stopped.group(1))
        assert 6 <= step < TOTAL and int(preempted_why(run_dir)) == step
        assert (run_dir / f"step-{step}" / "COMPLETE").is_file() and not (run_dir / "LOCK").exists()

        again = subprocess.run(command(launcher), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr
    assert f"resumed from {run_dir / f'step-{step}'}" in again.stdout
    final = final_state(run_dir)
    for part in ("model", "optimizer", "scheduler"):
        assert_bit_identical(final[part], reference[part], part)


def test_a_rerun_after_the_launcher_was_sigkilled_resumes_from_the_last_checkpoint(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    """SIGKILL gives no warning: the ranks die with the launcher (no orphan goes on training, as
    the issue saw), and the next run takes the dead launcher's lock over and resumes from the
    newest committed checkpoint, losing only the steps after it."""
    run_dir = tmp_path / "ckpt" / "exact"
    marker = f"djtest-{uuid.uuid4().hex}"  # in the environment of every process of this run
    proc = subprocess.Popen(
        command("srun"),
        cwd=tmp_path,
        env=env(DJ_TEST_STEP_DELAY="0.2", DJ_TEST_MARKER=marker),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stop_at(proc, 9, signal.SIGKILL)
    proc.wait()
    # Every rank and keeper dies with the launcher; once none is left, nothing can commit more.
    eventually(
        lambda: carrying(marker),
        until=lambda alive: not alive,
        timeout=10,
        interval=0.05,
        what="every process of the run to die with its launcher (pids carrying the marker)",
    )
    newest = committed(run_dir)[-1]
    again = subprocess.run(command("srun"), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr
    assert "took over the lock" in again.stdout and f"resumed from {run_dir / f'step-{newest}'}" in again.stdout
    assert_bit_identical(final_state(run_dir)["model"], reference["model"], "model")
