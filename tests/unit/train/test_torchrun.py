"""`python -m dist_jobs.train.torchrun`: real torchrun with two workers, exiting as the worker that
failed first did (torchrun itself exits 1 either way)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.tiers import requires
from support.train_support import PYTHON, child_env
from support.waiting import HUNG_S

pytestmark = requires("torch")  # the workers run under real torchrun

# Worker 1 ends as told; worker 0 waits to be stopped by torchrun (its end is a consequence).
WORKER = """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    how = sys.argv[1]
    os.kill(os.getpid(), signal.SIGKILL) if how == "kill" else sys.exit(int(how))
time.sleep(60)
"""


def torchrun(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    """Asked (as the pod entrypoint asks) to note its first failure in tmp_path/first-failure."""
    argv = [PYTHON, "-m", "dist_jobs.train.torchrun", "--standalone", "--nproc-per-node=2", "--no-python"]
    argv += [PYTHON, "-c", WORKER, how]
    env = {**child_env(), "DIST_JOBS_FIRST_FAILURE": str(tmp_path / "first-failure")}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=HUNG_S, cwd=tmp_path)


@pytest.mark.parametrize(
    ("how", "code", "said"),
    [
        ("kill", 137, "rank 1 failed first (killed by SIGKILL): exit 137"),  # a fault: restartable
        ("3", 3, "rank 1 failed first (exited): exit 3"),  # the program's own error: permanent
    ],
)
def test_torchrun_exits_as_its_first_failed_worker(tmp_path: Path, how: str, code: int, said: str) -> None:
    proc = torchrun(tmp_path, how)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert f"dist-jobs: torchrun: {said}" in proc.stderr
    assert "Root Cause (first observed failure)" in proc.stderr  # torchrun's own table is kept
    assert json.loads((tmp_path / "first-failure").read_text()) == {"rank": 1, "code": code}  # for the verdict


def test_torchrun_whose_workers_succeed_exits_0(tmp_path: Path) -> None:
    argv = [PYTHON, "-m", "dist_jobs.train.torchrun", "--standalone", "--nproc-per-node=2", "--no-python"]
    proc = subprocess.run(
        [*argv, PYTHON, "-c", "pass"], env=child_env(), capture_output=True, text=True, timeout=HUNG_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
