"""Checkpoint benchmark: how long training is blocked per save, and how long resuming loads.

(1) Blocked time per checkpoint: `Checkpointer(async_write=True).save()` (snapshot into reused CPU
    buffers, then return) against the baseline a training loop would otherwise pay, a synchronous
    `torch.save` + fsync of the same state. Median over --reps rounds after one warm-up round (so
    the snapshot buffers exist); each round runs baseline, async save and a bare memcpy of the
    same tensors back to back, so machine load hits all alike. The memcpy is the floor the async
    save cannot beat on CPU. The sync Checkpointer (hashing, COMPLETE, renames, fsyncs) is shown
    for reference. Goal: ratio <= 0.10x.
(2) `latest()` loading the committed checkpoint (size + CRC32 of shared.pt and this rank's
    file checked, loaded with weights_only=True, memory-mapped) against a bare torch.load of
    the same shared.pt (into fresh memory, unchecked). bench_resume_load.py compares with DCP.

State: --mb MiB in total, half float32 "parameters" and half an optimizer-like copy (momentum).
Everything is written to one temporary folder (--dir, default: the system temp dir), removed at
the end. Usage: python bench/bench_checkpoint.py [--mb 200] [--reps 9] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

import torch

from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.rng import rng_state

TENSOR_MB = 4


def make_state(total_mb: int) -> tuple[dict, list[torch.Tensor]]:
    """A model-like and an optimizer-like state dict, `total_mb` MiB together."""
    count = max(1, round(total_mb / 2 / TENSOR_MB))
    params = [torch.randn(TENSOR_MB * 2**20 // 4) for _ in range(count)]
    model = {f"layer{i}.weight": p for i, p in enumerate(params)}
    optimizer = {
        "state": {i: {"momentum_buffer": p.clone()} for i, p in enumerate(params)},
        "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": list(range(count))}],
    }
    return {"model": model, "optimizer": optimizer, "step": 0, "epoch": 0}, params


def train_a_little(params: list[torch.Tensor]) -> None:
    for p in params:  # the snapshot must copy fresh values every time
        p.add_(1e-3)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def plain_save(state: dict, path: Path) -> None:
    """The baseline: what a loop without async checkpointing blocks on. torch.save gets a path,
    its fastest form (C++ writer, no Python file object), then the file is fsynced."""
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink()


def interleaved(state: dict, params: list, work: Path, reps: int) -> dict[str, list[float]]:
    """Baseline, async save and a bare memcpy of the same tensors, interleaved so that load from
    other processes on the machine hits all three alike. Rep 0 is the warm-up (buffers, cache)."""
    ck = Checkpointer(work / "async", rank=0, world_size=1, keep=2, async_write=True)
    tensors = list(params) + [s["momentum_buffer"] for s in state["optimizer"]["state"].values()]
    spare = [torch.empty_like(t) for t in tensors]
    rows: dict[str, list[float]] = {"baseline": [], "blocked": [], "background": [], "memcpy": []}
    for step in range(reps + 1):
        train_a_little(params)
        baseline = timed(lambda: plain_save(state, work / "plain.pt"))
        train_a_little(params)
        state["step"] = step
        blocked = timed(lambda: ck.save(step, state, {"rng": rng_state()}))  # noqa: B023 (called at once)
        # The next checkpoint is normally minutes away: let this write finish outside the timing.
        rest = timed(ck.wait)
        memcpy = timed(lambda: [b.copy_(t) for b, t in zip(spare, tensors)])
        if step:
            for key, value in zip(rows, (baseline, blocked, blocked + rest, memcpy)):
                rows[key].append(value)
    ck.close()
    return rows


def sync_checkpointer_saves(state: dict, params: list, folder: Path, reps: int) -> list[float]:
    ck = Checkpointer(folder, rank=0, world_size=1, keep=2)
    times = []
    for step in range(reps + 1):
        train_a_little(params)
        took = timed(lambda: ck.save(step, state, {"rng": rng_state()}))  # noqa: B023 (called at once)
        if step:
            times.append(took)
    return times


def load_times(folder: Path, reps: int) -> tuple[list[float], list[float], int]:
    ck = Checkpointer(folder, rank=0, world_size=1)
    loaded = ck.latest()
    assert loaded is not None
    shared = loaded.path / "shared.pt"
    ours, plain = [], []
    for _ in range(reps):  # interleaved, as above
        ours.append(timed(ck.latest))
        plain.append(timed(lambda: torch.load(shared, weights_only=True, map_location="cpu")))
    return ours, plain, shared.stat().st_size


def fmt(times: list[float]) -> str:
    return f"median {statistics.median(times):.4f} s  (min {min(times):.4f}, max {max(times):.4f}, n={len(times)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="total state size in MiB")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (same disk for all)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    try:
        state, params = make_state(args.mb)
        size = sum(t.numel() * 4 for t in params) * 2
        print(
            f"state: {size / 2**20:.0f} MiB of float32 ({len(params)} params + momentum), "
            f"folder {work}, torch {torch.__version__}, {os.cpu_count()} CPUs"
        )
        rows = interleaved(state, params, work, args.reps)
        sync_ck = sync_checkpointer_saves(state, params, work / "sync", max(3, args.reps // 2))
        ratio = statistics.median(rows["blocked"]) / statistics.median(rows["baseline"])
        print(f"[1] baseline torch.save + fsync      : {fmt(rows['baseline'])}")
        print(f"    async save() blocked training    : {fmt(rows['blocked'])}")
        print(f"    bare memcpy of the same tensors  : {fmt(rows['memcpy'])}")
        print(f"    async write done in background   : {fmt(rows['background'])}")
        print(f"    sync Checkpointer.save (ref.)    : {fmt(sync_ck)}")
        paired = statistics.median(b / p for b, p in zip(rows["blocked"], rows["baseline"]))
        floor = statistics.median(rows["memcpy"]) / statistics.median(rows["baseline"])
        print(
            f"    ratio async blocked / baseline   : {ratio:.3f}x (goal <= 0.10x); "
            f"per-round median {paired:.3f}x; memcpy floor {floor:.3f}x"
        )
        ours, bare, nbytes = load_times(work / "async", args.reps)
        print(f"[2] latest() (verify + load {nbytes / 2**20:.0f} MiB) : {fmt(ours)}")
        print(f"    bare torch.load of shared.pt     : {fmt(bare)}")
        print(f"    ratio latest() / torch.load      : {statistics.median(ours) / statistics.median(bare):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
