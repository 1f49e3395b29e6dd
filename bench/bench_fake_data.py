"""A rank's start to its first batch of `data: fake`: the trainer's FakeImages (torch alone) vs
torchvision's FakeData through ToTensor (what the trainer used before), the same images.

    .venv/bin/python bench/bench_fake_data.py [--pairs 10]

Each side is a fresh `python -c` that builds the data set and loads its first batch of 32 16 px
images, as every rank of a run does at start-up; the two alternate, medians are compared (CPU
time of the process, user + system, and wall). OMP_NUM_THREADS=1, as the trainer's ranks on CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

OURS = """
from torch.utils.data import DataLoader
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.data import build_datasets
train, _ = build_datasets(TrainConfig(fake_samples=512, image_size=16))
next(iter(DataLoader(train, batch_size=32)))
"""

TORCHVISION = """
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
train = datasets.FakeData(size=512, image_size=(3, 16, 16), num_classes=10, transform=transforms.ToTensor())
next(iter(DataLoader(train, batch_size=32)))
"""


def once(code: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args()
    ours, theirs = [], []
    for _ in range(args.pairs):
        ours.append(once(OURS))
        theirs.append(once(TORCHVISION))
    for what, index in (("wall", 0), ("CPU", 1)):
        mine, other = statistics.median(r[index] for r in ours), statistics.median(r[index] for r in theirs)
        print(f"{what}: FakeImages {mine:.2f} s, torchvision FakeData {other:.2f} s: {mine / other:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
