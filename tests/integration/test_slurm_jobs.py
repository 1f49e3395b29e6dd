"""One job's life on the real test cluster through the Python API and the CLI: submit, wait,
logs, result, and the status of a failed rank (which rank, which code), by handle alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

import dist_jobs
from support import slurm_jobs
from support.specs import tiny_train
from support.tiers import requires
from support.waiting import HUNG_S

pytestmark = [requires("slurm"), pytest.mark.slow, pytest.mark.timeout(300)]


def spec_data(root: Path, name: str, **fields: Any) -> dict[str, Any]:
    """A 2 x 1 job of the one-epoch tiny_net run (support.specs.tiny_train)."""
    return slurm_jobs.spec_data(root, name, tiny_train(), **{"procs_per_node": 1, "unbuffered": False, **fields})


def dj(root: Path, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=root, timeout=timeout
    )


def test_python_api_submit_wait_logs_result(tmp_path: Path) -> None:
    spec = dist_jobs.load_spec(data=spec_data(tmp_path, "api-life"))
    job = dist_jobs.submit(spec, backend="slurm", jobs_dir=tmp_path / "runs", cwd=tmp_path)
    try:
        assert re.fullmatch(rf"slurm://[^/]+/{job.id}", str(job)), str(job)
        info = dist_jobs.attach(job.handle, jobs_dir=tmp_path / "runs", cwd=tmp_path).wait(timeout=HUNG_S, poll=1)
        assert (info.state, info.word) == (dist_jobs.JobState.SUCCEEDED, "COMPLETED"), list(job.logs(0))
        result = job.result()
        assert result["step"] == 4.0 and "train_loss" in result  # 32 samples / (2 ranks x batch 4)
        assert any("step 4/4" in line for line in job.logs(rank=0))
    finally:
        subprocess.run(["scancel", job.id], capture_output=True)


def test_cli_submit_wait_exits_1_and_status_names_the_failed_rank(tmp_path: Path) -> None:
    """A user's script whose rank 1 exits 3 fails once, the rank named, and is never requeued: srun
    stops the other ranks (the SIGTERM their status names) and exits 143, which is no fault."""
    path = tmp_path / "fails.yaml"
    path.write_text(yaml.safe_dump(spec_data(tmp_path, "cli-fails", procs_per_node=2)))
    code = textwrap.dedent("""
        import os, sys, time
        rank = int(os.environ["RANK"])
        print("rank", rank, "up", flush=True)
        time.sleep(1 if rank == 1 else 300)
        sys.exit(3 if rank == 1 else 0)
    """)
    jobs = ["--jobs-dir", str(tmp_path / "runs")]
    sub = dj(tmp_path, "submit", "--backend", "slurm", *jobs, "--wait", str(path), "--", "python3", "-c", code)
    handle = sub.stdout.splitlines()[0] if sub.stdout else ""
    try:
        assert sub.returncode == 1, sub.stdout + sub.stderr
        assert handle.startswith("slurm://") and "rank 1 failed first: exit 3" in sub.stderr
        status = json.loads(dj(tmp_path, "status", *jobs, "-o", "json", handle).stdout)
        assert (status["state"], status["word"]) == ("failed", "FAILED")
        assert status["detail"].startswith("rank 1 failed first: exit 3 on ")
        assert "failed at once: the program's own error is not retried" in status["detail"]
        assert status["extra"]["attempts"] == "1"  # a bug is never requeued
        assert status["ranks"]["1"].startswith("exit 3") and "SIGTERM" in status["ranks"]["0"]
        assert "None" not in json.dumps(status) and "allocation" not in json.dumps(status)
        logs = dj(tmp_path, "logs", *jobs, "--rank", "1", handle)
        assert "rank 1 up" in logs.stdout, logs.stderr
        assert dj(tmp_path, "wait", *jobs, handle).returncode == 1
    finally:
        if handle:
            subprocess.run(["scancel", handle.rsplit("/", 1)[1]], capture_output=True)


def test_a_users_script_whose_rank_is_sigkilled_restarts_in_place_and_completes(tmp_path: Path) -> None:
    """A user's own script (no dist-jobs trainer): rank 3 of 2 x 2 is SIGKILLed on the first start
    (what the OOM killer does); srun stops the others; the verdict is "rank killed", both nodes
    answer, and the batch script starts the step again in the same allocation, where it succeeds.
    One allocation, two verdicts, and status counts the restart."""
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(spec_data(tmp_path, "user-killed", procs_per_node=2)))
    marker = tmp_path / "killed-once"
    code = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        marker = Path({str(marker)!r})
        if os.environ["RANK"] == "3" and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5 if marker.exists() else 300)
        print("rank", os.environ["RANK"], "done", flush=True)
    """)
    jobs = ["--jobs-dir", str(tmp_path / "runs")]
    sub = dj(tmp_path, "submit", "--backend", "slurm", *jobs, "--wait", str(path), "--", "python3", "-c", code)
    handle = sub.stdout.splitlines()[0] if sub.stdout else ""
    try:
        assert sub.returncode == 0, sub.stdout + sub.stderr
        status = json.loads(dj(tmp_path, "status", *jobs, "-o", "json", handle).stdout)
        assert (status["state"], status["extra"]["attempts"]) == ("succeeded", "1"), status
        assert status["extra"]["restarts_in_place"] == "1", status
        job_id = handle.rsplit("/", 1)[1]
        lines = (tmp_path / "checkpoints" / "user-killed" / "verdicts" / f"{job_id}.jsonl").read_text().splitlines()
        ends = [(v["ending"], v["action"], v["rank"]) for v in map(json.loads, lines)]
        assert ends == [("rank killed", "restart", 3), ("completed", "done", None)], ends
        logs = dj(tmp_path, "logs", *jobs, "--rank", "3", handle).stdout
        assert "-attempt0.1-rank3.out <==" in logs and "rank 3 done" in logs, logs
    finally:
        if handle:
            subprocess.run(["scancel", handle.rsplit("/", 1)[1]], capture_output=True)
