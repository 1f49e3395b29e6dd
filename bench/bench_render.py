"""Median wall time of `dist-jobs render` against `python -c "import jinja2, yaml"`, same run.

    python bench/bench_render.py [--runs 21]

Both are started as fresh processes, interleaved, so machine load hits both alike. Goal: the
ratio is at most 2.0 (torchx's dry run, the nearest peer, is about 4x its baseline).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    baseline = [sys.executable, "-c", "import jinja2, yaml"]
    cases = {
        "render slurm": [
            sys.executable,
            "-m",
            "dist_jobs",
            "render",
            "--backend",
            "slurm",
            str(REPO / "slurm/examples/resnet-2x4.yaml"),
        ],
        "render k8s": [
            sys.executable,
            "-m",
            "dist_jobs",
            "render",
            "--backend",
            "k8s",
            str(REPO / "k8s/examples/resnet-2x4.yaml"),
        ],
    }
    for argv in [baseline, *cases.values()]:  # warm the page cache and .pyc files
        wall(argv)
    times: dict[str, list[float]] = {"baseline": [], **{k: [] for k in cases}}
    for _ in range(args.runs):
        times["baseline"].append(wall(baseline))
        for name, argv in cases.items():
            times[name].append(wall(argv))
    base = statistics.median(times["baseline"])
    print(f"baseline `python -c 'import jinja2, yaml'`: median {base * 1000:.1f} ms over {args.runs} runs")
    for name in cases:
        med = statistics.median(times[name])
        print(f"dist-jobs {name}: median {med * 1000:.1f} ms  ratio {med / base:.2f}x  (goal <= 2.0x)")


if __name__ == "__main__":
    main()
