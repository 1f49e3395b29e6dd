"""Training steps/s through the path each user takes, interleaved in one run, nothing set by hand:

    python bench/bench_launchers.py [--steps 40] [--rounds 3] [--workloads resnet,gpt]

- dist-jobs: `dist-jobs run --backend local --procs-per-node 2 job.yaml`, the built-in trainer;
- torchrun: `torchrun --nproc-per-node 2 launch_work.py hand ...`, a hand-written DDP loop;
- Fabric: `python launch_work.py fabric ...`, Lightning Fabric (devices=2) starting its processes.

Each launcher runs with its own defaults (threads included). Two CPU processes, gloo. ResNet-18
on FakeData 32x32 (batch 32 per process, SGD) and the built-in GPT on generated text (batch 32 x
64 tokens, AdamW). Rates come from rank 0's stamps at the start of every training forward,
after 5 warm-up steps, as 1 / median step time. The sides take turns within each round, and the
ratios against the hand-written loop of the same round are summarised by their median.
Also: the per-task launcher's start-up (`python -m dist_jobs.launch -- python -c pass` against
`python -c pass`, as an srun task), median of 21 interleaved runs.
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

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WARMUP = 5
# Every side runs from bytecode, as installed packages do: an inherited PYTHONDONTWRITEBYTECODE
# would make each start compile dist_jobs (and the others) from source. The .pyc files go to a
# folder of the bench's own, not into the checkout.
BASE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
BASE_ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="bench-launchers-pyc-")
TASK_ENV = {
    "SLURM_JOB_ID": "7",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_NNODES": "1",
    "SLURM_JOB_NODELIST": "n1",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1",
    "SLURM_STEP_ID": "0",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29500",
}


def rate(stamps_file: Path) -> float:
    times = json.loads(stamps_file.read_text())[WARMUP:]
    return 1 / statistics.median(b - a for a, b in zip(times, times[1:]))


def run(argv: list[str], stamps: Path, work: Path) -> float:
    # A fresh folder each time: dist-jobs would resume the last run's checkpoints in the same one.
    cwd = Path(tempfile.mkdtemp(dir=work))
    stamps.unlink(missing_ok=True)
    env = {**BASE_ENV, "BENCH_STAMPS": str(stamps), "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH)])}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    if not stamps.exists():
        raise SystemExit(f"{' '.join(argv)} left no stamps:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return rate(stamps)


def sides(workload: str, steps: int, work: Path) -> dict[str, list[str]]:
    spec = work / f"{workload}.yaml"
    if workload == "gpt":
        train = {
            "model": "launch_work:gpt",
            "data": "text",
            "batch_size": 32,
            "optimizer": "adamw",
            "lr": 0.003,
            "weight_decay": 0.0,
            "max_steps": steps,
            "epochs": 1000,
            "gpt_layers": 2,
            "gpt_heads": 4,
            "gpt_width": 128,
            "seq_len": 64,
            "text_chars": 400000,
            "eval_every_epoch": False,
        }
    else:
        train = {
            "model": "launch_work:resnet18",
            "image_size": 32,
            "fake_samples": steps * 64,
            "batch_size": 32,
            "epochs": 1,
            "eval_every_epoch": False,
        }
    spec.write_text(json.dumps({"name": f"bench-{workload}", "procs_per_node": 2, "train": train}))
    script = str(BENCH / "launch_work.py")
    return {
        "dist-jobs run": [str(Path(sys.executable).parent / "dist-jobs"), "run", "--backend", "local", str(spec)],
        "torchrun + hand loop": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            script,
            "hand",
            workload,
            str(steps),
        ],
        "Lightning Fabric": [sys.executable, script, "fabric", workload, str(steps)],
    }


def launcher_overhead(runs: int = 21) -> tuple[float, float]:
    env = {**BASE_ENV, **TASK_ENV, "PYTHONPATH": str(REPO)}
    plain = [sys.executable, "-c", "pass"]
    launched = [sys.executable, "-m", "dist_jobs.launch", "--", "python", "-c", "pass"]
    times: dict[str, list[float]] = {"plain": [], "launched": []}
    for _ in range(runs):
        for name, argv in (("plain", plain), ("launched", launched)):
            start = time.perf_counter()
            subprocess.run(argv, env=env, check=True)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["plain"]), statistics.median(times["launched"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="resnet,gpt")
    args = parser.parse_args()
    plain, launched = launcher_overhead()
    print(
        f"launcher start-up: python -c pass {plain * 1000:.0f} ms, through dist_jobs.launch "
        f"{launched * 1000:.0f} ms: +{(launched - plain) * 1000:.0f} ms (goal <= +100 ms)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for workload in args.workloads.split(","):
            commands = sides(workload, args.steps, work)
            rates: dict[str, list[float]] = {name: [] for name in commands}
            for round_ in range(args.rounds):
                order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
                for name in order:
                    rates[name].append(run(commands[name], work / "stamps.json", work))
                print(
                    f"{workload} round {round_ + 1}: "
                    + ", ".join(f"{n} {r[-1]:.2f} steps/s" for n, r in rates.items()),
                    flush=True,
                )
            hand = rates["torchrun + hand loop"]
            for name, got in rates.items():
                ratio = statistics.median(g / h for g, h in zip(got, hand))
                print(
                    f"{workload}: {name}: median {statistics.median(got):.2f} steps/s, {ratio:.3f}x the hand loop, "
                    f"{statistics.median(g / f for g, f in zip(got, rates['Lightning Fabric'])):.3f}x Fabric"
                )


if __name__ == "__main__":
    main()
