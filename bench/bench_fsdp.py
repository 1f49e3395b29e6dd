"""strategy fsdp: fit() against a hand-written FSDP2 loop, its memory against DDP's, and its
sharded checkpoints against calling DCP directly.

    .venv/bin/python bench/bench_fsdp.py [--world 2] [--width 384] [--layers 4] [--steps 14] [--pairs 2]

`world` CPU processes (gloo, OMP_NUM_THREADS=1), env:// by hand as torchrun sets it. The built-in
GPT (width/layers as given, 4 heads, context 64) on the generated text, batch 4 per process,
AdamW (fused where torch has it, as fit() builds it), fp32 on both sides.

- steps/s: `fit(strategy=fsdp)` against a loop written as the FSDP2 tutorial does (fully_shard
  per block then the root, on the meta device, to_empty + reset_parameters, DistributedSampler,
  DataLoader). A subclass of the GPT stamps each training forward on rank 0: start-up, the
  first steps (warm-up) and evaluation are left out, both sides are timed the same way. The
  sides alternate in the same processes (a new process group each), the median of the per-pair
  ratios of median step times is printed.
- memory per rank: bytes of this rank's parameters, gradients and AdamW state after one step,
  FSDP (as fit() shards) against DDP (as fit() places), and the process's peak RSS.
- checkpoints: ShardedCheckpointer.save (DCP + shared.pt + each rank's file + COMPLETE, fsyncs,
  rename, latest) against dcp.save of the same state (save() returns once the step counts; the
  wait for its pruning of older checkpoints on a thread is timed after it, apart, and the two
  together against dcp.save + shutil.rmtree of the checkpoint two back, keep=2); loading
  (latest() + load_sharded) against get_state_dict + dcp.load + set_state_dict (each pair in
  turn first); the time an async save blocks training against a synchronous one. Medians of
  `--rounds` rounds (the ratios: medians of each round's ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WARMUP = 4
CONTEXT, BATCH, HEADS = 64, 4, 4
STAMPS: list[tuple[float, float]] = []  # (wall, this process's CPU time) at each training forward


def gpt() -> Any:
    """The built-in GPT of the bench's size, stamping each training forward (rank 0's clock)."""
    from dist_jobs.train.lm import GPT

    class Stamped(GPT):
        def forward(self, tokens: Any) -> Any:
            if self.training:
                STAMPS.append((time.perf_counter(), time.process_time()))
            return super().forward(tokens)

    return Stamped(int(os.environ["BENCH_LAYERS"]), HEADS, int(os.environ["BENCH_WIDTH"]), CONTEXT)


def config(steps: int, **extra: Any) -> Any:
    from dist_jobs.spec.train import TrainConfig

    return TrainConfig(
        model="bench_fsdp:gpt",
        data="text",
        seq_len=CONTEXT,
        text_chars=200_000,
        batch_size=BATCH,
        optimizer="adamw",
        lr=1e-3,
        epochs=1,
        max_steps=steps,
        eval_every_epoch=False,
        progress=False,
        log_every=10,
        **{"strategy": "fsdp", **extra},
    )


def step_time() -> tuple[float, float]:
    """(median wall time, mean CPU time) per step after the warm-up; resets the stamps. CPU time
    barely moves with outside load: time spent waiting for a core is not counted."""
    times = STAMPS[WARMUP:]
    STAMPS.clear()
    wall = statistics.median(b[0] - a[0] for a, b in zip(times, times[1:]))
    return wall, (times[-1][1] - times[0][1]) / (len(times) - 1)


def hand_written(steps: int) -> tuple[float, float]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from fsdp2_by_hand import shard_by_hand
    from torch.utils.data import DataLoader, DistributedSampler

    from dist_jobs.train.data import build_datasets

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = gpt()
    shard_by_hand(model, model.blocks)
    dataset = build_datasets(config(steps))[0]
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    for _, (tokens, targets) in zip(range(steps), loader):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()
    return step_time()


def with_fit(steps: int) -> tuple[float, float]:
    from dist_jobs.train.loop import fit

    fit(config(steps))
    return step_time()


def state_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """This rank's parameters, gradients and optimizer state, in bytes."""
    import torch
    from torch.distributed.tensor import DTensor

    def size(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    optim = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "params": sum(size(p) for p in model.parameters()),
        "grads": sum(size(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer": sum(size(v) for v in optim),
    }


def one_step(strategy: str) -> tuple[Any, Any, dict[str, int]]:
    """A model placed as fit() places it, after one AdamW step (gradients kept)."""
    import torch

    from dist_jobs.train import fsdp, models

    c = config(1, strategy=strategy)
    if strategy == "fsdp":
        model = wrapped = fsdp.shard(fsdp.build(c), c, torch.device("cpu"), warn=False)
    else:
        model, wrapped = models.place(gpt(), c, torch.device("cpu"), int(os.environ["WORLD_SIZE"]), warn=False)
    optimizer = models.build_optimizer(c, model, 1)
    tokens = torch.randint(0, 96, (BATCH, CONTEXT))
    wrapped(tokens).float().mean().backward()
    optimizer.step()
    return model, optimizer, state_bytes(model, optimizer)


def timed(run: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    run()
    dist.barrier()
    return time.perf_counter() - start


def checkpoint_times(model: Any, optimizer: Any, rounds: int, folder: Path) -> dict[str, float]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from dist_jobs.train.checkpoint.sharded import ShardedCheckpointer, load_sharded, sharded_state
    from dist_jobs.train.distributed import max_over_ranks

    rank, world = dist.get_rank(), dist.get_world_size()
    ours = ShardedCheckpointer(folder / "ours", rank=rank, world_size=world, keep=2)
    later = ShardedCheckpointer(folder / "async", rank=rank, world_size=world, keep=2, async_write=True)
    shared = {"step": 0, "format": "dcp"} if rank == 0 else None
    keys = ("save", "pruning", "dcp_save", "dcp_keep", "load", "dcp_load", "async_blocked")
    times: dict[str, list[float]] = {k: [] for k in keys}

    def direct_load(step: int) -> None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optimizer": osd}
        dcp.load(state, checkpoint_id=folder / f"direct-{step}")
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def keep_two(step: int, state: dict[str, Any]) -> None:  # a user keeping two checkpoints with dcp.save
        dcp.save(state, checkpoint_id=folder / f"kept-{step}")
        if rank == 0:
            shutil.rmtree(folder / f"kept-{step - 2}", ignore_errors=True)

    def our_load() -> None:
        loaded = ours.latest(max_over_ranks)
        assert loaded is not None
        load_sharded(model, optimizer, loaded.path, agree=max_over_ranks)

    for step in range(rounds):
        state = sharded_state(model, optimizer)
        mine = {"rank": rank}
        saves = [("save", partial(ours.save, step, shared, mine, state))]
        saves.append(("dcp_save", partial(dcp.save, state, checkpoint_id=folder / f"direct-{step}")))
        saves.append(("dcp_keep", partial(keep_two, step, state)))
        loads = [("load", our_load), ("dcp_load", partial(direct_load, step))]
        for name, run in saves[:: 1 if step % 2 else -1] + loads[:: 1 if step % 2 else -1]:
            times[name].append(timed(run))  # in turn first: the page cache's write-back hits both
            if name == "save":  # save() returns once the step counts; its pruning runs on a thread
                times["pruning"].append(timed(ours.wait))
        times["async_blocked"].append(timed(partial(later.save, step, shared, mine, state)))
        later.wait()
    ours.close()
    later.close()
    result = {k: statistics.median(v) for k, v in times.items()}
    whole = [a + b for a, b in zip(times["save"], times["pruning"])]
    for name, ours_s, theirs in (
        ("save", times["save"], "dcp_save"),
        ("whole", whole, "dcp_keep"),
        ("load", times["load"], "dcp_load"),
    ):
        result[f"{name}_ratio"] = statistics.median(a / b for a, b in zip(ours_s, times[theirs]))
    return result


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    base = int(os.environ["BENCH_BASE_PORT"])
    sides = [("hand", hand_written), ("fit", with_fit)]
    ratios, cpu_ratios, medians = [], [], {"hand": [], "fit": []}
    for pair in range(args.pairs):
        result = {}
        for k, (name, run) in enumerate(sides if pair % 2 == 0 else sides[::-1]):
            os.environ["MASTER_PORT"] = str(base + 2 * pair + k)
            result[name] = run(args.steps)
            medians[name].append(result[name])
        ratios.append(result["hand"][0] / result["fit"][0])  # steps/s of fit over the hand loop's
        cpu_ratios.append(result["hand"][1] / result["fit"][1])
    os.environ["MASTER_PORT"] = str(base + 2 * args.pairs)
    dist.init_process_group("gloo")
    model, optimizer, sharded = one_step("fsdp")
    whole = one_step("ddp")[2]
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        folder = Path(scratch)
        dist.broadcast_object_list(box := [str(folder)], src=0)
        ckpt = checkpoint_times(model, optimizer, args.rounds, Path(box[0]))
    if dist.get_rank() == 0:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        summary = {"fit_over_hand": statistics.median(ratios), "ratios": ratios, "step_s": medians}
        summary["cpu"] = {"fit_over_hand": statistics.median(cpu_ratios), "ratios": cpu_ratios}
        print(json.dumps({**summary, "fsdp": sharded, "ddp": whole, "peak_rss": rss, "checkpoint": ckpt}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", default=None, help="where the checkpoints go (default: the temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # through the module fit() imports the model from, so both see the same STAMPS
        import bench_fsdp

        bench_fsdp.worker(args)
        return
    from dist_jobs.backends.local.runner import free_port

    scratch = args.scratch or tempfile.gettempdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCH)]),
        "OMP_NUM_THREADS": "1",
        "DIST_JOBS_ENV": "torchrun",
        "WORLD_SIZE": str(args.world),
        "LOCAL_WORLD_SIZE": str(args.world),
        "MASTER_ADDR": "127.0.0.1",
        "BENCH_BASE_PORT": str(free_port() if args.world else 0),
        "BENCH_WIDTH": str(args.width),
        "BENCH_LAYERS": str(args.layers),
        "DIST_JOBS_RDZV_TIMEOUT": "60",
    }
    argv = [sys.executable, __file__, "--worker", *sys.argv[1:], "--scratch", scratch]
    ranks = [
        subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, text=True)
        for r in range(args.world)
    ]
    outputs = [rank.communicate()[0] for rank in ranks]
    if any(rank.returncode for rank in ranks):
        raise SystemExit(f"a rank failed: {[rank.returncode for rank in ranks]}")
    report(json.loads(outputs[0].strip().splitlines()[-1]), args)


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    mib = 2**20
    print(f"GPT width {args.width}, {args.layers} blocks, {args.world} CPU processes")
    pairs = ", ".join(f"{x:.3f}" for x in r["ratios"])
    print(f"steps/s fit(strategy=fsdp) / hand-written FSDP2: {r['fit_over_hand']:.3f}x (pairs {pairs})")
    pairs = ", ".join(f"{x:.3f}" for x in r["cpu"]["ratios"])
    print(f"steps per CPU second of rank 0, same ratio: {r['cpu']['fit_over_hand']:.3f}x (pairs {pairs})")
    print("per-rank state (MiB)      FSDP     DDP   ratio")
    for key in ("params", "grads", "optimizer"):
        f, d = r["fsdp"][key] / mib, r["ddp"][key] / mib
        print(f"  {key:<22} {f:7.2f} {d:7.2f}  {f / d:.3f}")
    f, d = sum(r["fsdp"].values()) / mib, sum(r["ddp"].values()) / mib
    print(f"  {'total':<22} {f:7.2f} {d:7.2f}  {f / d:.3f}   (peak RSS rank 0: {r['peak_rss'] / mib:.0f} MiB)")
    c = r["checkpoint"]
    print(f"save: {c['save']:.3f} s vs dcp.save {c['dcp_save']:.3f} s: {c['save_ratio']:.2f}x (median of rounds)")
    print(
        f"  then the wait for its pruning {c['pruning']:.3f} s; save + that wait vs dcp.save + rmtree of the "
        f"checkpoint two back ({c['dcp_keep']:.3f} s): {c['whole_ratio']:.2f}x"
    )
    print(f"load: {c['load']:.3f} s vs dcp.load {c['dcp_load']:.3f} s: {c['load_ratio']:.2f}x (median of rounds)")
    print(f"async save blocks {c['async_blocked']:.3f} s = {c['async_blocked'] / c['save']:.2f}x a synchronous save")


if __name__ == "__main__":
    main()
