"""Steps/s of the entrypoint's loop against a minimal hand-written DDP loop (goal >= 0.98x).

    .venv/bin/python bench/bench_train_steps.py [--steps 20] [--pairs 10]

Two CPU processes (gloo, OMP_NUM_THREADS=1), the same resnet18, the same FakeData 16x16
(the entrypoint's: see data.py), batch 32 per process, SGD (lr 0.1, momentum 0.9, wd 5e-4).
The entrypoint side is `fit()`, the body of
`python -m dist_jobs.train`, with its defaults (cosine schedule, metrics every 10 steps,
progress bar, per-step preemption poll), no checkpoints. Rank 0 stamps the start of every
training forward inside the model, so start-up and evaluation are left out and both sides
are timed the same way; each run's first 5 steps are warm-up. Printed per run: the mean
rate, and the rate from the median step time, which shrugs off bursts of outside load (it
would hide a cost paid less often than every other step: the metrics reduce every 10 steps),
and steps per CPU second of rank 0's process (all threads: gloo's too), which outside load
barely moves because time spent waiting for a core is not counted.
The two processes stay up and alternate (hand-written, fit, fit, hand-written, ...; a new
process group for each run) so that load from other work on the machine hits both sides
alike; the median of the per-pair ratios is printed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from dist_jobs.ranks.ports import free_port

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WARMUP = 5
BATCH, IMAGE, SEED = 32, 16, 0


def stamped(inner: Any) -> Any:
    """Wrap a model so rank 0 records when it was built and when each training forward
    starts; written to $BENCH_STAMPS at exit as {"built": t, "steps": [t, ...]} (time.time())."""
    from torch import nn

    class Stamped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.built = time.time()
            self.stamps: list[float] = []
            self.cpu: list[float] = []  # this process's CPU time, all threads
            if os.environ.get("BENCH_STAMPS"):
                atexit.register(self.dump)

        def forward(self, x: Any) -> Any:
            if self.training:
                self.stamps.append(time.time())
                self.cpu.append(time.process_time())
            return self.inner(x)

        def rates(self) -> tuple[float, float, float]:
            """After the warm-up: steps/s (mean, from the median step), steps per CPU second."""
            times = self.stamps[WARMUP:]
            steps = [b - a for a, b in zip(times, times[1:])]
            return (
                len(steps) / (times[-1] - times[0]),
                1 / statistics.median(steps),
                len(steps) / (self.cpu[-1] - self.cpu[WARMUP]),
            )

        def dump(self) -> None:
            if os.environ.get("RANK", "0") == "0":
                Path(os.environ["BENCH_STAMPS"]).write_text(json.dumps({"built": self.built, "steps": self.stamps}))

    return Stamped()


def resnet18(num_classes: int = 10) -> Any:
    """Also the factory for the command line: --model bench_train_steps:resnet18."""
    import torch
    import torchvision

    torch.manual_seed(SEED)
    return stamped(torchvision.models.resnet18(num_classes=num_classes))


def config(steps: int, **extra: Any) -> Any:
    from dist_jobs.spec.train import TrainConfig

    return TrainConfig(image_size=IMAGE, fake_samples=steps * BATCH * 2, batch_size=BATCH, epochs=1, seed=SEED, **extra)


def fake_data(steps: int) -> Any:
    """The entrypoint's FakeData (torchvision's images, without its per-item reseeding), so
    both sides load the same data at the same cost."""
    from dist_jobs.train.data import build_datasets

    return build_datasets(config(steps))[0]


def hand_written(steps: int) -> tuple[float, float, float]:
    """The plain loop, in the style of the seed scripts."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    model = resnet18()
    ddp = DDP(model)
    dataset = fake_data(steps)
    sampler = DistributedSampler(dataset, seed=SEED)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sampler.set_epoch(0)
    for images, target in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(images), target)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
    return model.rates()


def entrypoint(steps: int) -> tuple[float, float, float]:
    from dist_jobs.train.loop import fit

    model = resnet18()
    fit(config(steps), model)
    return model.rates()


def alternate(sides: list[tuple[str, Callable[[int], Any]]], pairs: int) -> dict[str, list[Any]]:
    """Run each side once per pair, in alternating order, each in a fresh process group."""
    base_port = int(os.environ["BENCH_BASE_PORT"])
    results: dict[str, list[Any]] = {name: [] for name, _ in sides}
    for pair in range(pairs):
        for k, (name, run) in enumerate(sides if pair % 2 == 0 else sides[::-1]):
            os.environ["MASTER_PORT"] = str(base_port + len(sides) * pair + k)
            results[name].append(run(pair))
    return results


def port_block(count: int) -> int:
    """The first of `count` consecutive ports that are free now, outside the kernel's
    ephemeral range (where other processes' outgoing connections would take them)."""
    from dist_jobs.ranks.ports import bindable, ephemeral_range, usable_segments

    low, high = usable_segments(ephemeral_range())[0]
    for base in random.Random().sample(range(low, high - count), 50):
        if all(bindable(port) for port in range(base, base + count)):
            return base
    raise SystemExit(f"found no {count} free consecutive ports in {low}-{high}")


def launch_workers(script: str, args: list[str], runs: int, world: int = 2) -> None:
    """Start `script --worker args` as `world` ranks (env:// by hand) and wait for them."""
    extra = {
        "DIST_JOBS_ENV": "torchrun",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "BENCH_BASE_PORT": str(port_block(runs)),
        "DIST_JOBS_RDZV_TIMEOUT": "60",
    }
    with tempfile.TemporaryFile() as log:  # the ranks' logs and progress bars, shown on failure
        ranks = [
            subprocess.Popen(
                [*_nice(), sys.executable, script, "--worker", *args],
                cwd=REPO,
                stderr=log,
                env=_env({**extra, "RANK": str(r), "LOCAL_RANK": str(r)}),
            )
            for r in range(world)
        ]
        while any(rank.poll() is None for rank in ranks):
            if any(rank.poll() not in (None, 0) for rank in ranks):  # the other would wait
                for rank in ranks:
                    rank.kill()
            time.sleep(0.5)
        codes = [rank.returncode for rank in ranks]
        if codes != [0] * world:
            log.seek(0)
            raise SystemExit(f"benchmark ranks exited {codes}:\n{log.read().decode()[-4000:]}")


def worker(steps: int, pairs: int) -> None:
    rates = alternate(
        [("hand-written", lambda _: hand_written(steps)), ("entrypoint", lambda _: entrypoint(steps))], pairs
    )
    if os.environ["RANK"] != "0":
        return
    for which, label in ((0, "mean rate"), (1, "median step"), (2, "CPU time")):
        for name, values in rates.items():
            print(f"{label:>11} {name:>12}: " + " ".join(f"{r[which]:.3f}" for r in values))
        ratios = [e[which] / h[which] for h, e in zip(rates["hand-written"], rates["entrypoint"])]
        print(f"{label:>11} pair ratios: " + " ".join(f"{r:.3f}" for r in ratios))
        print(
            f"entrypoint / hand-written loop, steps/s by {label}: median of {pairs} pairs "
            f"{statistics.median(ratios):.3f}x (goal >= 0.98x)"
        )


def torchrun(target: list[str], env: dict[str, str], nproc: int = 2, timeout: float = 900) -> float:
    """Run `target` under torchrun; its wall time in seconds. Raise with the log on failure."""
    argv = [
        *_nice(),
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        *target,
    ]
    start = time.time()
    done = subprocess.run(argv, cwd=REPO, env=_env(env), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.time() - start


def _nice() -> list[str]:
    # On a shared machine other work skews one side or the other; a higher priority (root
    # only) shields both sides alike.
    return ["nice", "-n", "-10"] if os.geteuid() == 0 else []


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH)]),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.pairs)
    launch_workers(__file__, ["--steps", str(args.steps), "--pairs", str(args.pairs)], runs=2 * args.pairs)


if __name__ == "__main__":
    main()
