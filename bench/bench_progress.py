"""What live progress and the hang watchdog cost a training step (goal <= 0.5 % of step time).

    .venv/bin/python bench/bench_progress.py [--steps 40] [--pairs 6] [--log-every 10]

The same run twice per pair, alternating which goes first: bench_train_steps.py's set-up (two
CPU processes, gloo, OMP_NUM_THREADS=1, resnet18 on FakeData 16x16, batch 32 per process, the
entrypoint's fit()), with a run directory on both sides. "with": as shipped, rank 0 rewrites
progress.json and appends metrics.jsonl every --log-every steps, and every rank beats its hang
watchdog after each step. "without": train.hang_watchdog off and Live.update a no-op. Rank 0
stamps each training forward; the first 5 steps are warm-up. Printed: the mean step time of each
run, by the wall clock and by rank 0's CPU time (which other load on the machine barely moves;
both include the costs paid every --log-every steps, which a median step would hide), the
median of the per-pair ratios, and, measured directly in this process, the time of one
Live.update and one Watchdog.beat, turned into a per-step share of the median step time:
    (beat + update / log_every) / step.
The direct figure is the precise one; the pair ratio shows that nothing else moved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bench_train_steps import config, launch_workers, resnet18  # noqa: E402

REPO = BENCH.parent
GOAL = 0.005


def one_run(steps: int, log_every: int, folder: Path, name: str, instrumented: bool) -> tuple[float, float]:
    """Mean step time of one fit() after the warm-up: wall, and rank 0's CPU time (all threads)."""
    from dist_jobs.train import live
    from dist_jobs.train.loop import fit

    original = live.Live.update
    if not instrumented:
        live.Live.update = lambda *a, **k: None  # type: ignore[method-assign]
    try:
        model = resnet18()
        c = config(steps, log_every=log_every, checkpoint_dir=str(folder), run_name=name, hang_watchdog=instrumented)
        fit(c, model)
    finally:
        live.Live.update = original  # type: ignore[method-assign]
    mean_rate, _, cpu_rate = model.rates()
    return 1.0 / mean_rate, 1.0 / cpu_rate


def worker(steps: int, pairs: int, log_every: int, root: str) -> None:
    times: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
    base_port = int(os.environ["BENCH_BASE_PORT"])
    for pair in range(pairs):
        order = ["without", "with"] if pair % 2 == 0 else ["with", "without"]
        for k, side in enumerate(order):
            os.environ["MASTER_PORT"] = str(base_port + 2 * pair + k)
            times[side].append(one_run(steps, log_every, Path(root), f"{side}-{pair}", side == "with"))
    if os.environ["RANK"] != "0":
        return
    for which, label in ((0, "wall"), (1, "CPU")):
        for side, values in times.items():
            print(f"mean step {label:>4} {side:>7}: " + " ".join(f"{1000 * t[which]:.1f}" for t in values) + " ms")
        ratios = [w[which] / wo[which] for wo, w in zip(times["without"], times["with"])]
        print(f"pair ratios {label} with/without: " + " ".join(f"{r:.4f}" for r in ratios))
        print(
            f"end to end ({label}): with / without, mean step time, median of {pairs} pairs: "
            f"{statistics.median(ratios):.4f}x"
        )
    direct(statistics.median(t[0] for t in times["without"]), log_every)


def direct(step_s: float, log_every: int, rounds: int = 2000) -> None:
    """Time Live.update and Watchdog.beat themselves, and their share of a step."""
    from dist_jobs.train.live import Live
    from dist_jobs.train.watchdog import Watchdog

    values = {"loss": 2.3, "accuracy": 0.1, "samples": 64.0, "samples_per_s": 500.0, "lr": 0.1}
    with tempfile.TemporaryDirectory() as tmp:
        progress = Live(Path(tmp), total_steps=10**6, attempt=0)
        progress.start(0)
        start = time.perf_counter()
        for step in range(1, rounds + 1):
            progress.update(step, 0, values)
        update = (time.perf_counter() - start) / rounds
    dog = Watchdog(20.0, 300.0)
    start = time.perf_counter()
    for _ in range(100 * rounds):
        dog.beat()
    beat = (time.perf_counter() - start) / (100 * rounds)
    share = (beat + update / log_every) / step_s
    print(
        f"direct: Live.update {1e6 * update:.0f} us (every {log_every} steps), Watchdog.beat {1e6 * beat:.2f} us "
        f"(every step); step {1000 * step_s:.1f} ms: {100 * share:.4f} % of step time "
        f"(goal <= {100 * GOAL:.1f} %: {'met' if share <= GOAL else 'NOT met'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.pairs, args.log_every, args.root)
    with tempfile.TemporaryDirectory(prefix="bench-progress.") as root:
        flags = ["--steps", str(args.steps), "--pairs", str(args.pairs), "--log-every", str(args.log_every)]
        launch_workers(__file__, [*flags, "--root", root], runs=2 * args.pairs)


if __name__ == "__main__":
    main()
