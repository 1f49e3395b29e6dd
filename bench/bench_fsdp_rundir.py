"""strategy fsdp as users launch it (`dist-jobs run`, so with a run directory) against a hand-written
FSDP2 loop under torchrun, every training step counted (issue 36).

    python bench/bench_fsdp_rundir.py [--steps 100] [--rounds 3] [--warmup 0] [--width 256] [--layers 4] [--with-fit]

Both sides: 2 CPU processes, gloo, OMP_NUM_THREADS=1; the decoder Transformer of PyTorch's own
FSDP2 tests (bench/third_party_transformer.py, vendored), built on the meta device, fully_shard
on every TransformerBlock then on the root, materialised with to_empty + reset_parameters;
dist_jobs' generated text (context 64, the same samples in the same order), `--batch` sequences
per process; fused AdamW (no weight decay), the gradient norm clipped to 1.0, fp32.

- dist-jobs: `dist-jobs run --backend local --nodes 1 --procs-per-node 2 job.yaml` with
  `train.strategy: fsdp` and the model as `module:factory`, the built-in trainer's fit(). Its run
  directory is in a temporary folder, so everything a healthy run does is on: the lock (held by
  the launcher, whose thread beats its lease; rank 0 checks the token before each write),
  every rank's hang watchdog and its beat file, progress.json and metrics.jsonl every log_every
  steps (the default), the ledger. Its one checkpoint is the one at the end, after the timed steps.
- torchrun: `torchrun --nproc-per-node 2 bench_fsdp_rundir.py --hand`, the loop of the FSDP2
  tutorial: DistributedSampler, DataLoader, forward, cross-entropy, backward, clip, step, zero_grad.
- fit under torchrun (`--with-fit`): `torchrun --nproc-per-node 2 -m dist_jobs.train` with the same
  train flags and no checkpoint directory, so no run directory: what separates fit()'s own loop
  from what the run directory and dist-jobs' launcher add.

Timing, rank 0: a forward pre-hook stamps the start of every training forward (wall clock and
the process's CPU time). Each side trains warmup + steps + 1 steps; the timed window runs from
the start of step warmup + 1 to the start of step warmup + steps + 1, so it holds `steps` whole
steps, each with all that its loop does before the next one begins (fit()'s step boundary, its
log lines and progress writes, and its evaluation were there any). `--warmup W` leaves the same
first W steps out on both sides (default 0: the first step, with FSDP's lazy initialisation,
counts). Start-up and the final checkpoint are outside the window. Printed: each side's steps/s
per round, the ratio dist-jobs / torchrun per round (the same for rank 0's CPU seconds) and the
median of the rounds' ratios. The sides take turns: dist-jobs first in odd rounds.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORLD = 2
CONTEXT = 64
LR, CLIP = 1e-3, 1.0
GOAL = 0.98
DEFAULT_LOG_EVERY = 10  # fit()'s own default (train.log_every): what a user's run does
FIT = "fit under torchrun"


def text_chars(args: argparse.Namespace) -> int:
    """Enough generated text that no epoch ends inside the run (a tenth of it is held out)."""
    steps = args.warmup + args.steps + 2
    return max(200_000, int(steps * args.batch * WORLD * (CONTEXT + 1) / 0.85))


def train_section(args: argparse.Namespace) -> dict[str, Any]:
    """The job's `train:`; the hand loop builds its data from the same fields."""
    return {
        "strategy": "fsdp",
        "model": "bench_fsdp_rundir:transformer",  # the third-party model, stamped
        "fsdp_policy": ["third_party_transformer:TransformerBlock"],
        "data": "text",
        "seq_len": CONTEXT,
        "text_chars": text_chars(args),
        "batch_size": args.batch,
        "optimizer": "adamw",
        "lr": LR,
        "weight_decay": 0.0,
        "grad_clip": CLIP,
        "amp": "none",
        "epochs": 1,
        "max_steps": args.warmup + args.steps + 1,
        "eval_every_epoch": False,
        "device": "cpu",
    }


def stamping(model: Any) -> Any:
    """Stamp the start of each training forward on rank 0; the stamps go to $BENCH_STAMPS at exit."""
    import torch

    stamps: list[tuple[float, float]] = []

    def stamp(module: Any, inputs: Any) -> None:
        if module.training:
            stamps.append((time.perf_counter(), time.process_time()))

    def dump() -> None:
        if stamps and os.environ.get("RANK") == "0":  # torchrun and dist-jobs' launcher both export it
            record = {"threads": torch.get_num_threads(), "stamps": stamps}
            Path(os.environ["BENCH_STAMPS"]).write_text(json.dumps(record))

    model.register_forward_pre_hook(stamp)
    atexit.register(dump)
    return model


def transformer() -> Any:
    """dist-jobs' side: the model factory the job names (module:factory)."""
    from third_party_transformer import transformer as build

    return stamping(build())


def hand(args: argparse.Namespace) -> None:
    """The hand-written FSDP2 loop (torchrun sets the env:// variables)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from fsdp2_by_hand import shard_by_hand
    from third_party_transformer import TransformerBlock
    from third_party_transformer import transformer as build
    from torch.utils.data import DataLoader, DistributedSampler

    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.data import build_datasets

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = stamping(build())
    shard_by_hand(model, [block for block in model.modules() if isinstance(block, TransformerBlock)])
    section = train_section(args)
    config = TrainConfig(data="text", seq_len=CONTEXT, text_chars=section["text_chars"])
    dataset = build_datasets(config)[0]
    loader = DataLoader(dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, seed=0), drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    for _, (tokens, targets) in zip(range(section["max_steps"]), loader):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


def commands(args: argparse.Namespace, work: Path) -> dict[str, list[str]]:
    spec = work / "job.yaml"
    job = {"name": "bench-fsdp-rundir", "nodes": 1, "procs_per_node": WORLD, "train": train_section(args)}
    spec.write_text(json.dumps(job))  # JSON is YAML
    flags = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD)]
    sides = {
        "dist-jobs run": [sys.executable, "-m", "dist_jobs", "run", "--backend", "local", "--nodes", "1"]
        + ["--procs-per-node", str(WORLD), str(spec)],
        "torchrun": [*torchrun, str(Path(__file__).resolve()), "--hand", *flags],
    }
    if args.with_fit:
        from dist_jobs.spec.load import load_spec

        sides[FIT] = [*torchrun, "-m", "dist_jobs.train", *load_spec(data=job).train.to_argv()]
    return sides


def run_side(
    argv: list[str], work: Path, args: argparse.Namespace, run_directory: bool = True
) -> tuple[float, float, int, float]:
    """(steps/s by the wall clock, steps per CPU second of rank 0, threads, median step in seconds) of
    one run; `run_directory`: whether the job is given a checkpoint directory (fit() alone is not)."""
    cwd = Path(tempfile.mkdtemp(dir=work))  # a fresh run directory: nothing to resume
    stamps = cwd / "stamps.json"
    env = {
        **os.environ,
        # the caller's path kept after ours (packages installed beside the interpreter's)
        "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
        "BENCH_STAMPS": str(stamps),
        "BENCH_WIDTH": str(args.width),
        "BENCH_LAYERS": str(args.layers),
        "BENCH_CONTEXT": str(CONTEXT),
    }
    if run_directory:
        env["DIST_JOBS_CHECKPOINT_DIR"] = str(cwd / "checkpoints")
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not stamps.exists():
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    record = json.loads(stamps.read_text())
    window = record["stamps"][args.warmup : args.warmup + args.steps + 1]
    if len(window) != args.steps + 1:
        raise SystemExit(f"{' '.join(argv)}: {len(record['stamps'])} steps stamped, wanted {args.steps + 1}")
    (wall0, cpu0), (wall1, cpu1) = window[0], window[-1]
    median = statistics.median(b[0] - a[0] for a, b in zip(window, window[1:]))
    return args.steps / (wall1 - wall0), args.steps / (cpu1 - cpu0), record["threads"], median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0, help="first steps left out, on both sides")
    parser.add_argument("--batch", type=int, default=4, help="sequences per process")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--with-fit", action="store_true", help="a third side: fit() under torchrun, no run directory")
    parser.add_argument("--hand", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand:
        return hand(args)
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    rates: dict[str, list[tuple[float, float, int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-rundir.") as folder:
        sides = commands(args, Path(folder))
        for round_ in range(args.rounds):
            for name in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
                rates.setdefault(name, []).append(run_side(sides[name], Path(folder), args, name != FIT))
            ours, theirs = rates["dist-jobs run"][-1], rates["torchrun"][-1]
            print(
                f"round {round_ + 1}: dist-jobs run {ours[0]:.3f} steps/s, torchrun {theirs[0]:.3f} steps/s: "
                f"{ours[0] / theirs[0]:.3f}x (per CPU second of rank 0: {ours[1] / theirs[1]:.3f}x; mean step "
                f"{1000 / ours[0]:.1f} / {1000 / theirs[0]:.1f} ms, median {1000 * ours[3]:.1f} / "
                f"{1000 * theirs[3]:.1f} ms; threads {ours[2]} / {theirs[2]})",
                flush=True,
            )
            if FIT in rates:
                fit = rates[FIT][-1]
                ratios = f"{fit[0] / theirs[0]:.3f}x torchrun, dist-jobs run {ours[0] / fit[0]:.3f}x it"
                print(f"  {FIT} {fit[0]:.3f} steps/s: {ratios}", flush=True)
    report(rates, args)


def listed(ratios: list[float]) -> str:
    return ", ".join(f"{r:.3f}" for r in ratios)


def report(rates: dict[str, list[tuple[float, float, int, float]]], args: argparse.Namespace) -> None:
    pairs = list(zip(rates["dist-jobs run"], rates["torchrun"]))
    wall = [a[0] / b[0] for a, b in pairs]
    cpu = [a[1] / b[1] for a, b in pairs]
    ratio = statistics.median(wall)
    print(f"Transformer width {args.width} x {args.layers} blocks, batch {args.batch} x {CONTEXT} per process")
    print(
        f"steps/s, dist-jobs run (fit, strategy fsdp, run directory) / torchrun + hand FSDP2 loop, {args.steps} "
        f"steps each (warm-up left out: {args.warmup}): {ratio:.3f}x (rounds {listed(wall)}); "
        f"per CPU second of rank 0 {statistics.median(cpu):.3f}x (rounds {listed(cpu)})"
    )
    if FIT in rates:
        fit = [f[0] / b[0] for f, b in zip(rates[FIT], rates["torchrun"])]
        run = [a[0] / f[0] for a, f in zip(rates["dist-jobs run"], rates[FIT])]
        print(
            f"{FIT} / torchrun + hand loop {statistics.median(fit):.3f}x (rounds {listed(fit)}); "
            f"dist-jobs run / {FIT} {statistics.median(run):.3f}x (rounds {listed(run)})"
        )
    print(f"goal >= {GOAL}x: {'met' if ratio >= GOAL else 'not met'}; load after: {Path('/proc/loadavg').read_text()}")


if __name__ == "__main__":
    main()
