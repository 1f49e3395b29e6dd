"""A rank killed mid-run: time to the first new training step, restart in place vs requeue.

    .venv/bin/python bench/bench_fault_restart.py [--rounds 2]

Needs the local 2-node cluster (bash slurm/cluster/up.sh) and nothing else running on it.

Each round submits the same 2-node x 2-process job of the built-in trainer twice, through
`dist-jobs submit` as a user does: once as it comes (`preemption.max_restarts: 3`: the batch
script restarts the step inside the allocation) and once with `max_restarts: 0` (the allocation is
given up and the job requeued, what dist-jobs did before). Once checkpoint step-8 is committed,
rank 3's trainer (on n2) is SIGKILLed, as the OOM killer would. Measured: from the kill (this
process's clock) to the `time` of the first metrics.jsonl row rank 0 writes after the verdict
that the batch script recorded for the attempt the kill ended (log_every 1: every step has a
row), both clocks this machine's. The two paths alternate; medians are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_slurm_submit import spec_data, tiny_net, wait_until

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def slow_net(num_classes: int = 10) -> Any:
    """Factory for the entrypoint: the submit bench's net, each forward slowed by
    DJ_BENCH_STEP_DELAY seconds, so the run is still going when its rank is killed."""
    from torch import nn

    delay = float(os.environ.get("DJ_BENCH_STEP_DELAY", "0"))

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_net(num_classes)

        def forward(self, x: Any) -> Any:
            time.sleep(delay)
            return self.net(x)

    return Slow()


def spec(root: Path, name: str, max_restarts: int) -> Path:
    """The submit bench's job, slowed, 3 epochs (48 steps), a checkpoint every 4 steps."""
    data = spec_data(root, name)
    data["env"]["DJ_BENCH_STEP_DELAY"] = "0.3"
    data["preemption"] = {"max_restarts": max_restarts}
    data["train"].update(model="bench_fault_restart:slow_net", epochs=3, checkpoint_every_steps=4)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trainer_of_rank(job_id: str, rank: int) -> int | None:
    """The pid of the job's training process of global rank `rank` (both nodes run on this machine)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and f"RANK={rank}".encode() in environ:
            if b"dist_jobs.train" in cmdline:
                return int(proc.name)
    return None


def rows(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.endswith("}")]


def first_step_after_fault(run_dir: Path, job_id: str) -> float | None:
    """The time of rank 0's first step row after the verdict on the killed attempt, if there is one."""
    try:
        verdicts = [json.loads(v) for v in (run_dir / "verdicts" / f"{job_id}.jsonl").read_text().splitlines()]
    except OSError:
        return None
    if not verdicts:
        return None
    decided = float(verdicts[0]["time"])
    later = [float(r["time"]) for r in rows(run_dir) if float(r["time"]) > decided]
    return min(later) if later else None


def one(root: Path, name: str, max_restarts: int) -> tuple[float, str]:
    """(seconds from the kill to the first new step, the verdict's action) of one job."""
    sub = subprocess.run(
        [sys.executable, "-m", "dist_jobs", "submit", "--backend", "slurm", str(spec(root, name, max_restarts))],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = sub.stdout.split()[0].rsplit("/", 1)[1]
    run_dir = root / "checkpoints" / name
    try:
        wait_until(lambda: (run_dir / "step-8" / "COMPLETE").exists(), 300, "checkpoint step-8")
        wait_until(lambda: trainer_of_rank(job_id, 3) is not None, 30, "rank 3's trainer")
        pid = trainer_of_rank(job_id, 3)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        wait_until(lambda: first_step_after_fault(run_dir, job_id) is not None, 300, "the first new step")
        first = first_step_after_fault(run_dir, job_id)
        assert first is not None
        action = json.loads((run_dir / "verdicts" / f"{job_id}.jsonl").read_text().splitlines()[0])["action"]
        return first - killed, action
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
        wait_until(
            lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip(), 120, "idle"
        )


def squeue() -> str:
    return subprocess.run(["squeue", "--noheader"], capture_output=True, text=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"restart": [], "requeue": []}
    with tempfile.TemporaryDirectory(prefix="bench-fault-") as tmp:
        root = Path(tmp)
        for n in range(args.rounds):
            for path, max_restarts in (("requeue", 0), ("restart", 3)):
                took, action = one(root, f"fault-{path}-{n}", max_restarts)
                assert action == path, (path, action)
                times[path].append(took)
                print(f"round {n}: {path:8s} kill -> first new step {took:6.1f} s", flush=True)
    restart, requeue = statistics.median(times["restart"]), statistics.median(times["requeue"])
    print(f"restart in place: median {restart:.1f} s; requeue: median {requeue:.1f} s; ratio {restart / requeue:.2f}x")
    return 0 if restart <= 60 else 1


if __name__ == "__main__":
    sys.exit(main())
