"""Loading a 200 MB checkpoint into a live model and optimizer: ours against torch.distributed.checkpoint.

    python bench/bench_resume_load.py [--mb 200] [--reps 15] [--dir PATH]

The state: --mb MiB of float32 in 4 MiB tensors, half "parameters" and half an optimizer's
momentum (bench_checkpoint.make_state). It is written once by our Checkpointer and once by
`torch.distributed.checkpoint.save`, into one folder on the same disk. The target is a second
state of the same shapes, standing for the live model and optimizer.

Each round, interleaved so machine load hits all alike:
- ours: `Checkpointer.latest()` (size + CRC32 of shared.pt and rank-0.pt checked, loaded with
  weights_only=True), then every tensor copied into the target, as load_state_dict does;
- DCP: `torch.distributed.checkpoint.load(target)`, which reads into the target in place and
  verifies nothing;
- floor: torch.load(mmap=True) + the same copy, no checksum: what verifying costs on top.
Goal: ours at most 1.2x DCP (medians; the per-round median of ratios is shown too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed.checkpoint as dcp
from bench_checkpoint import make_state

from dist_jobs.train.checkpoint.checkpointer import Checkpointer


def copy_into(source: Any, target: Any) -> None:
    """Every tensor of `source` into the tensor at the same place in `target` (load_state_dict)."""
    if isinstance(target, torch.Tensor):
        target.copy_(source)
    elif isinstance(target, dict):
        for key, value in target.items():
            copy_into(source[key], value)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (same disk for all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialized
    work = Path(tempfile.mkdtemp(prefix="bench-load-", dir=args.dir))
    try:
        state, _ = make_state(args.mb)
        ck = Checkpointer(work / "ours", rank=0, world_size=1)
        ck.save(1, state, {"rank": 0})
        dcp.save(state, checkpoint_id=str(work / "dcp"))
        os.sync()  # write-back of what was just written must not run during the timings
        target, _ = make_state(args.mb)
        shared = work / "ours" / "step-1" / "shared.pt"

        def ours() -> None:
            loaded = ck.latest()
            assert loaded is not None
            copy_into(loaded.shared, target)

        def floor() -> None:
            copy_into(torch.load(shared, mmap=True, weights_only=True, map_location="cpu"), target)

        cases = {"ours": ours, "dcp": lambda: dcp.load(target, checkpoint_id=str(work / "dcp")), "floor": floor}
        for fn in cases.values():  # warm-up: page cache, lazy imports
            fn()
        rows: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.reps):
            for name, fn in cases.items():
                rows[name].append(timed(fn))
        assert all(torch.equal(a, b) for a, b in zip(target["model"].values(), state["model"].values()))
        report(rows, shared.stat().st_size)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(rows: dict[str, list[float]], nbytes: int) -> None:
    print(f"{nbytes / 2**20:.0f} MiB, torch {torch.__version__}, median of {len(rows['ours'])} interleaved rounds")
    for name, what in (
        ("ours", "latest() + copy into the target"),
        ("dcp", "torch.distributed.checkpoint.load"),
        ("floor", "torch.load(mmap) + copy, no CRC"),
    ):
        times = rows[name]
        print(f"  {what:36s}: {statistics.median(times) * 1000:7.1f} ms (min {min(times) * 1000:.1f})")
    ratio = statistics.median(rows["ours"]) / statistics.median(rows["dcp"])
    paired = statistics.median(o / d for o, d in zip(rows["ours"], rows["dcp"]))
    print(f"  ratio ours / DCP: {ratio:.2f}x (per-round median {paired:.2f}x); goal <= 1.2x")


if __name__ == "__main__":
    main()
