"""`dist-jobs submit` to the first training step of a 2-node x 2-process SLURM job, vs plain sbatch.

    .venv/bin/python bench/bench_slurm_submit.py [--repeats 3]

Needs the local cluster (bash slurm/cluster/up.sh) and nothing else running on it.

Measured (wall clock of this process, `time.monotonic()`):
- dist-jobs: from just before `python -m dist_jobs submit --backend slurm job.yaml` is started
  to the moment rank 0's log of attempt 0 (`<log_dir>/<run>-<jobid>-attempt0-rank0.out`) first
  contains `step 1/`, the line the entrypoint logs once the first optimizer step is done
  (`log_every: 1`). The file is polled every 20 ms. It includes the CLI's own start (spec
  load, render), sbatch, scheduling, the batch script (head node, port), srun, Python and
  torch start-up in 4 processes, gloo rendezvous over the nodes' network namespaces, DDP set-up,
  data and model build, and that one step of a tiny conv net on 16 px FakeData (batch 4).
  The job is cancelled right after; the next run waits until the cluster is idle again.
- baseline: from just before `sbatch --parsable -N2 --ntasks-per-node=2 --wrap 'srun hostname'`
  is started to the moment its output file holds all 4 hostnames (same polling).

Runs alternate (baseline, dist-jobs, baseline, ...); medians are compared. The cluster's 4 ranks
share this machine's 2 cores, so most of the dist-jobs time is 4 Python+torch start-ups at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
POLL_S = 0.02


def tiny_net(num_classes: int = 10) -> Any:
    """Factory for the entrypoint: --model bench_slurm_submit:tiny_net."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(8 * 16, num_classes)
    )


def spec(root: Path, name: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec_data(root, name), sort_keys=False))
    return path


def spec_data(root: Path, name: str) -> dict[str, Any]:
    """The 2-node x 2-process job of the tiny net on fake data, logging every step."""
    return {
        "name": name,
        "nodes": 2,
        "procs_per_node": 2,
        "cpus_per_task": 1,
        "time": "10",
        "log_dir": str(root / "logs"),
        "checkpoint_dir": str(root / "checkpoints"),
        "setup": [f'export PATH="{Path(sys.executable).parent}:$PATH"'],
        "env": {"PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH)]), "OMP_NUM_THREADS": "1"},
        "train": {
            "model": "bench_slurm_submit:tiny_net",
            "data": "fake",
            "image_size": 16,
            "fake_samples": 256,
            "batch_size": 4,
            "epochs": 1,
            "device": "cpu",
            "log_every": 1,
            "progress": False,
        },
    }


def wait_until(ready: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: no {what} within {timeout:.0f} s")
        time.sleep(POLL_S)


def cluster_idle() -> bool:
    states = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format", "%t"], capture_output=True, text=True
    ).stdout.split()
    return len(states) >= 2 and all(state == "idle" for state in states)


def job_gone(job_id: str) -> bool:
    proc = subprocess.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"], capture_output=True, text=True)
    return proc.returncode != 0 or proc.stdout.strip() in ("", "CANCELLED", "COMPLETED", "FAILED")


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def dist_jobs_run(root: Path, index: int) -> dict[str, Any]:
    """Seconds from the submit command's start to: job id printed, batch script running, first step."""
    name = f"bench{index}"
    path = spec(root, name)
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dist_jobs",
            "submit",
            "--backend",
            "slurm",
            str(path),
            "--jobs-dir",
            str(root / "runs"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
    )
    times = {"submitted": time.monotonic() - start}
    if proc.returncode != 0:
        raise SystemExit(f"bench: dist-jobs submit failed: {proc.stderr}")
    job_id = proc.stdout.strip()
    batch = root / "logs" / f"{name}-{job_id}.out"
    rank0 = root / "logs" / f"{name}-{job_id}-attempt0-rank0.out"

    def first_step() -> bool:
        # The batch script's first line says it runs (the allocation started); then rank 0's step 1.
        if "script" not in times and f"job {job_id} attempt 0" in read(batch):
            times["script"] = time.monotonic() - start
        return "step 1/" in read(rank0)

    try:
        wait_until(first_step, 180, f"first step in {rank0}")
        times["first_step"] = time.monotonic() - start
        times.setdefault("script", times["first_step"])
        return {"job_id": job_id, **times}
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
        wait_until(lambda: job_gone(job_id) and cluster_idle(), 120, f"end of job {job_id}")


def baseline_run(root: Path, index: int) -> float:
    out = root / f"baseline-{index}.out"
    start = time.monotonic()
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--ntasks-per-node=2",
            f"--output={out}",
            "--job-name=bench-baseline",
            "--wrap",
            "srun hostname",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench: sbatch failed: {proc.stderr}")
    wait_until(lambda: len(read(out).split()) >= 4, 120, f"4 hostnames in {out}")
    elapsed = time.monotonic() - start
    wait_until(lambda: job_gone(proc.stdout.strip().split(";")[0]) and cluster_idle(), 120, "baseline end")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    wait_until(cluster_idle, 300, "idle cluster (another job is running on it)")
    baseline: list[float] = []
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp_name:
        root = Path(tmp_name)
        for i in range(args.repeats):
            baseline.append(baseline_run(root, i))
            runs.append(dist_jobs_run(root, i))
            run = runs[-1]
            print(
                f"run {i}: baseline {baseline[-1]:.2f} s; dist-jobs job {run['job_id']}: submit returned "
                f"{run['submitted']:.2f} s, batch script ran {run['script']:.2f} s, first step "
                f"{run['first_step']:.2f} s",
                flush=True,
            )

    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    print(
        json.dumps(
            {
                "repeats": args.repeats,
                "baseline_sbatch_srun_hostname_s": round(statistics.median(baseline), 2),
                "dist_jobs_submit_returned_s": round(median("submitted"), 2),
                "dist_jobs_batch_script_running_s": round(median("script"), 2),
                "dist_jobs_submit_to_first_step_s": round(median("first_step"), 2),
                "ratio_first_step_vs_baseline": round(median("first_step") / statistics.median(baseline), 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
