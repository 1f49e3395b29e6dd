"""One GPU: the built-in GPT under FSDP2 with bf16 (as strategy fsdp shards it) and under DDP with
AMP (as strategy ddp places it), tokens/s and model FLOPs utilisation of each, then the sharded
checkpoint round trip (ShardedCheckpointer.save, latest(), load_sharded). Prints one JSON line.

    python bench/gpu_fsdp_check.py [--width 1024] [--layers 12] [--seq-len 512] [--batch 16] [--steps 30]
    python bench/gpu_fsdp_check.py --dry-run     # CPU, tiny sizes, a few steps: checks the script runs

One process (a world of one: FSDP2 still shards over a mesh of one and runs its hooks, casts
and DCP's planning). MFU counts 6 x parameters + 12 x layers x width x context FLOPs per token
(forward and backward, attention included) against the card's dense bf16 peak (--peak-tflops;
default from the device name: H100/H200 989, A100 312), after `--warmup` steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: check that the script runs")
    args = p.parse_args()
    if args.dry_run:
        args.width, args.layers, args.heads, args.seq_len, args.batch, args.steps, args.warmup = 32, 2, 2, 16, 2, 3, 1
    return args


def setup(args: argparse.Namespace) -> Any:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.dry_run else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=300))
    return device


def config(args: argparse.Namespace, strategy: str) -> Any:
    from dist_jobs.spec.train import TrainConfig

    return TrainConfig(
        model="gpt",
        gpt_layers=args.layers,
        gpt_heads=args.heads,
        gpt_width=args.width,
        seq_len=args.seq_len,
        optimizer="adamw",
        lr=1e-4,
        amp="bf16",
        strategy=strategy,
    )


def build(args: argparse.Namespace, strategy: str, device: Any) -> tuple[Any, Any, Any]:
    """(model, what to call, autocast) as fit() builds them for `strategy`."""
    import torch

    from dist_jobs.train import fsdp, models

    c = config(args, strategy)
    torch.manual_seed(0)
    if strategy == "fsdp":
        model = fsdp.shard(fsdp.build(c), c, device, warn=False)
        return model, model, nullcontext  # its MixedPrecisionPolicy casts to bf16
    model, wrapped = models.place(models.build_model("gpt", 10, c), c, device, 1, warn=False)
    return model, wrapped, lambda: torch.autocast(device.type, torch.bfloat16)


def throughput(args: argparse.Namespace, strategy: str, device: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from dist_jobs.train import models

    model, wrapped, autocast = build(args, strategy, device)
    optimizer = models.build_optimizer(config(args, strategy), model, 1)
    tokens = torch.randint(0, 96, (args.batch, args.seq_len + 1), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync()
            start = time.perf_counter()
        with autocast():
            logits = wrapped(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    seconds = time.perf_counter() - start
    per_second = args.steps * args.batch * args.seq_len / seconds
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * params + 12 * args.layers * args.width * args.seq_len
    peak = peak_flops(args, device)
    peak_memory = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    result = {"tokens_per_s": per_second, "params": params, "step_s": seconds / args.steps, "peak_bytes": peak_memory}
    result["mfu"] = flops_per_token * per_second / peak if peak else None
    return {"model": model, "optimizer": optimizer, "result": result}


def peak_flops(args: argparse.Namespace, device: Any) -> float | None:
    import torch

    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf * 1e12 for key, tf in PEAK_TFLOPS.items() if key in name), None)


def round_trip(model: Any, optimizer: Any, folder: Path) -> dict[str, Any]:
    """Save through the trainer's ShardedCheckpointer, scramble the weights, load them back."""
    import torch

    from dist_jobs.train.checkpoint.sharded import ShardedCheckpointer, load_sharded, sharded_state

    ckpt = ShardedCheckpointer(folder, rank=0, world_size=1, keep=2)
    before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    start = time.perf_counter()
    ckpt.save(1, {"step": 1, "format": "dcp"}, {"rank": 0}, sharded_state(model, optimizer))
    saved = time.perf_counter() - start
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    start = time.perf_counter()
    loaded = ckpt.latest()
    assert loaded is not None
    load_sharded(model, optimizer, loaded.path)
    load_s = time.perf_counter() - start
    after = {k: v.full_tensor() for k, v in model.state_dict().items()}
    equal = all(torch.equal(before[k], after[k]) for k in before)
    size = sum(f.stat().st_size for f in loaded.path.iterdir())
    ckpt.close()
    return {"save_s": saved, "load_s": load_s, "bytes": size, "equal_after_load": equal}


def main() -> None:
    args = parse()
    import torch
    import torch.distributed as dist

    device = setup(args)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    summary: dict[str, Any] = {"device": name, "dry_run": args.dry_run, "sizes": vars(args)}
    fsdp_run = throughput(args, "fsdp", device)
    summary["fsdp_bf16"] = fsdp_run["result"]
    with tempfile.TemporaryDirectory() as scratch:
        summary["checkpoint"] = round_trip(fsdp_run["model"], fsdp_run["optimizer"], Path(scratch) / "run")
    del fsdp_run
    summary["ddp_amp_bf16"] = throughput(args, "ddp", device)["result"]
    dist.destroy_process_group()
    print(json.dumps(summary))
    if not summary["checkpoint"]["equal_after_load"]:
        sys.exit("the sharded checkpoint round trip changed the weights")


if __name__ == "__main__":
    main()
