"""Resume cost per rank against the world size: simulated checkpoints of 8, 512 and 4,096 ranks.

    python bench/bench_resume_world.py [--worlds 8 512 4096] [--sample 64] [--rounds 5] [--dir PATH]

Each world's checkpoint is written by the real writer (one Checkpointer.save per rank, rank 0
last, so it commits), with small files: a ~100 KB shared state and each rank's RNG state. fsync
is switched off while writing (setting up, not measured). Then a sample of ranks resumes one at
a time, as each rank of a job would: `Checkpointer(dir, rank=r, world_size=W).latest()`, timed,
counting the files it opens. The worlds take turns rank by rank (interleaved), so machine load
hits all alike. The figure is the median per-rank time at each world size and its ratio to the
smallest world's; goal: 4,096 ranks at most 1.2x 8 ranks.

Opens are counted in-process: Python's audit events `open` (open(), io.open, os.open, but not
os.fdopen of a descriptor already open) and `os.listdir`/`os.scandir` (a directory listed counts
as one open), plus torch's own C++ open for memory-mapped loads
(UntypedStorage.from_file), which raises no audit event. A job's total per resume is the
per-rank count times the world size (every rank does the same).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, no install

import torch

from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.rng import rng_state

STEP = 100
_counting: Counter[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # open() of an int wraps a descriptor already open (os.fdopen): no new open.
    if _counting is not None and event in ("open", "os.listdir", "os.scandir") and not isinstance(args[0], int):
        _counting[str(args[0])] += 1


def _from_file(original: Any) -> Any:
    def counted(filename: str, *args: Any, **kwargs: Any) -> Any:
        if _counting is not None:
            _counting[str(filename)] += 1
        return original(filename, *args, **kwargs)

    return counted


sys.addaudithook(_audit)
torch.UntypedStorage.from_file = _from_file(torch.UntypedStorage.from_file)  # type: ignore[method-assign]


@contextmanager
def counting_opens() -> Iterator[Counter[str]]:
    global _counting
    _counting = found = Counter()
    try:
        yield found
    finally:
        _counting = None


def write_world(folder: Path, world: int) -> None:
    """One committed checkpoint of `world` ranks, written the way a job writes it."""
    shared = {"model": {f"layer{i}.weight": torch.randn(6400) for i in range(4)}, "step": STEP}
    real_fsync, os.fsync = os.fsync, lambda fd: None  # set-up only: not what is measured
    try:
        # Rank 0 first (its constructor clears stale partial folders), its save last (it commits).
        first = Checkpointer(folder, rank=0, world_size=world, finalize_timeout=5)
        for rank in range(1, world):
            Checkpointer(folder, rank=rank, world_size=world).save(STEP, None, {"rng": rng_state(), "rank": rank})
        first.save(STEP, shared, {"rng": rng_state(), "rank": 0})
    finally:
        os.fsync = real_fsync
    assert (folder / f"step-{STEP}" / "COMPLETE").is_file()


def resume_one(folder: Path, rank: int, world: int) -> tuple[float, int]:
    """(seconds, files opened) for one rank's Checkpointer + latest()."""
    with counting_opens() as opened:
        start = time.perf_counter()
        loaded = Checkpointer(folder, rank=rank, world_size=world).latest()
        took = time.perf_counter() - start
    assert loaded is not None and loaded.step == STEP and loaded.rank_state["rank"] == rank
    return took, sum(opened.values())


def sample_ranks(world: int, size: int) -> list[int]:
    """`size` ranks spread over the world (all of them, repeated, in a small world)."""
    return [(i * world) // size if world >= size else i % world for i in range(size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[8, 512, 4096])
    parser.add_argument("--sample", type=int, default=64, help="ranks timed per world and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (local disk)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-world-", dir=args.dir))
    try:
        for world in args.worlds:
            start = time.perf_counter()
            write_world(work / str(world), world)
            print(f"wrote a {world}-rank checkpoint in {time.perf_counter() - start:.1f} s")
        os.sync()  # write-back of what was just written must not run during the timings
        times: dict[int, list[float]] = {w: [] for w in args.worlds}
        opens: dict[int, list[int]] = {w: [] for w in args.worlds}
        for world in args.worlds:  # warm-up: page cache, lazy imports
            resume_one(work / str(world), 0, world)
        samples = {w: sample_ranks(w, args.sample) for w in args.worlds}
        for _ in range(args.rounds):
            for i in range(args.sample):
                for world in args.worlds:  # one rank of each world in turn
                    took, count = resume_one(work / str(world), samples[world][i], world)
                    times[world].append(took)
                    opens[world].append(count)
        report(args.worlds, times, opens)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(worlds: list[int], times: dict[int, list[float]], opens: dict[int, list[int]]) -> None:
    base = statistics.median(times[worlds[0]])
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; median over {len(times[worlds[0]])} rank resumes each")
    print("| ranks | per-rank resume (median) | vs smallest | files opened per rank | per resume, all ranks |")
    print("|---|---|---|---|---|")
    for world in worlds:
        med = statistics.median(times[world])
        per_rank = max(opens[world])
        print(
            f"| {world} | {med * 1000:.2f} ms | {med / base:.2f}x | {min(opens[world])}-{per_rank} "
            f"| {per_rank * world:,} |"
        )


if __name__ == "__main__":
    main()
