"""Whole-run cost of asynchronous checkpoints every 30 s against none (goal <= 3 %).

    .venv/bin/python bench/bench_checkpoint_overhead.py [--steps 250] [--pairs 3]

The entrypoint's training (`fit()`, the body of `python -m dist_jobs.train`), 2 CPU processes:
resnet18 on FakeData 16x16, batch 32 per process, so a 90 MB checkpoint (weights and SGD
momentum). Once with `checkpoint_every_minutes=0.5, async_checkpoint=True`, once without a
checkpoint dir. Measured on rank 0 (which writes the shared file): the wall time of the whole
fit() call, evaluation and the final (always awaited) checkpoint included, and the CPU time
of its process, all threads (the background writer's serialising, hashing and fsync too):
the CPU figure moves less with outside load. The default of 250 steps lasts about 70 s, so
each checkpointed run saves twice mid-run and once at the end. Also printed, independent of
outside load: per checkpoint, how long the loop was blocked (save(), and the final wait())
and the CPU time of the writer thread, i.e. the cost of one checkpoint per 30 s in a long run.
The two processes stay up and alternate (none, async, async, none, ...; a new process group
and checkpoint folder for each run); medians of the per-pair overheads are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_train_steps import alternate, config, launch_workers, resnet18


def instrument() -> dict[str, list[float]]:
    """Per checkpoint on this rank: seconds the loop was blocked (save(), and the final
    wait()), and CPU seconds the background writer thread used (time.thread_time)."""
    from dist_jobs.train.checkpoint.checkpointer import Checkpointer
    from dist_jobs.train.checkpoint.write import BackgroundWriter

    costs: dict[str, list[float]] = {"blocked": [], "writer_cpu": []}
    save, wait, submit = Checkpointer.save, Checkpointer.wait, BackgroundWriter.submit
    inside = {"save": False}

    def timed_save(self: Checkpointer, *args: object, **kwargs: object) -> None:
        start, inside["save"] = time.perf_counter(), True
        try:
            save(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            inside["save"] = False
            costs["blocked"].append(time.perf_counter() - start)

    def timed_wait(self: Checkpointer) -> None:
        start = time.perf_counter()
        wait(self)
        if not inside["save"]:  # save() waits for the previous write itself: counted there
            costs["blocked"].append(time.perf_counter() - start)

    def timed_submit(self: BackgroundWriter, job: Callable[[], None]) -> None:
        def measured() -> None:
            start = time.thread_time()
            try:
                job()
            finally:
                costs["writer_cpu"].append(time.thread_time() - start)

        submit(self, measured)

    Checkpointer.save, Checkpointer.wait = timed_save, timed_wait  # type: ignore[method-assign]
    BackgroundWriter.submit = timed_submit  # type: ignore[method-assign]
    return costs


def run(steps: int, checkpoints: Path | None, every_minutes: float) -> tuple[float, float, int]:
    """(wall s, CPU s, checkpoints written) of one fit()."""
    from dist_jobs.train.loop import fit

    saving = (
        {}
        if checkpoints is None
        else {"checkpoint_dir": str(checkpoints), "async_checkpoint": True, "checkpoint_every_minutes": every_minutes}
    )
    wall, cpu = time.perf_counter(), time.process_time()
    fit(config(steps, **saving), resnet18())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    saved = len(list((checkpoints / "default").glob("step-*"))) if checkpoints else 0
    return wall, cpu, saved


def worker(steps: int, pairs: int, every_minutes: float, root: Path) -> None:
    costs = instrument()
    results = alternate(
        [
            ("none", lambda pair: run(steps, None, every_minutes)),
            ("async", lambda pair: run(steps, root / f"run{pair}", every_minutes)),
        ],
        pairs,
    )
    if os.environ["RANK"] != "0":
        return
    print("checkpoints per async run: " + " ".join(str(r[2]) for r in results["async"]))
    for which, label in ((0, "wall"), (1, "CPU")):
        for name, values in results.items():
            print(f"{label:>4} {name:>5}: " + " ".join(f"{r[which]:.2f}" for r in values) + " s")
        over = [a[which] / n[which] - 1 for n, a in zip(results["none"], results["async"])]
        print(f"{label:>4} overhead per pair: " + " ".join(f"{o * 100:+.2f}%" for o in over))
        print(
            f"checkpoint every {every_minutes:g} min, async, vs none, {label} time of the whole "
            f"run: median {statistics.median(over) * 100:+.2f} % (goal <= 3 %)"
        )
    saves = sum(r[2] for r in results["async"])
    blocked, writer = sum(costs["blocked"]) / saves, sum(costs["writer_cpu"]) / saves
    print(
        f"per checkpoint on rank 0: loop blocked {blocked * 1000:.0f} ms, writer thread "
        f"{writer * 1000:.0f} ms CPU; with 2 busy cores the writer's CPU is taken from training, "
        f"so one checkpoint per {every_minutes * 60:g} s costs at most "
        f"{(blocked + writer) / (every_minutes * 60) * 100:.2f} % of a long run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--every-minutes", type=float, default=0.5)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.pairs, args.every_minutes, Path(args.root))
    with tempfile.TemporaryDirectory() as root:
        launch_workers(
            __file__,
            [
                "--steps",
                str(args.steps),
                "--pairs",
                str(args.pairs),
                "--every-minutes",
                str(args.every_minutes),
                "--root",
                root,
            ],
            runs=2 * args.pairs,
        )


if __name__ == "__main__":
    main()
