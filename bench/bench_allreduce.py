"""DDP's gloo all-reduce against fit()'s shared-memory one, the steps of one run taking turns:

    python bench/bench_allreduce.py [--steps 96] [--runs 3] [--workloads resnet,gpt] [--world 2,4]

`--world` CPU processes on this host (2 by default; each size is measured in turn), one
intra-op thread each (what `dist-jobs run` gives them on 2 cores). Each builds its model and
optimizer as fit() does (models.place: DDP with gradients as bucket views; the fused optimizer)
and registers one hook that hands every bucket either to
DDP's own allreduce_hook (gloo over loopback TCP) or to shm_reduce.shared_mean, switching every
two steps, so both see the same machine load. Batches are random tensors of the trainer's
shapes (ResNet-18: 32 images 32x32; GPT: 32 x 64 tokens), so data loading is left out. Prints
the median step time of each and their ratio, per run, after 6 warm-up steps.

End to end, through `dist-jobs run`, see bench_launchers.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dist_jobs.ranks.ports import free_port

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import datetime, json, os, statistics, sys, time
import torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import models, shm_reduce
from dist_jobs.train.lm import build_gpt

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
workload, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
if workload == "gpt":
    config = TrainConfig(model="gpt", optimizer="adamw", gpt_layers=2, gpt_heads=4, gpt_width=128, seq_len=64)
    inputs = torch.randint(0, 96, (32, 64))
    net = build_gpt(config)
    target = torch.randint(0, 96, (32, 64))
else:
    import torchvision
    config = TrainConfig()
    net = torchvision.models.resnet18(num_classes=10)
    inputs, target = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
model, ddp = models.place(net, config, torch.device("cpu"), world, warn=False)
optimizer = models.build_optimizer(config, model, world)
state = shm_reduce.open_arena(ddp, rank, world, datetime.timedelta(seconds=120))
assert state is not None, "no shared arena: see the log"
use_shared = [False]

def either(_, bucket):
    return shm_reduce.shared_mean(state, bucket) if use_shared[0] else allreduce_hook(None, bucket)

ddp.register_comm_hook(None, either)
times = {False: [], True: []}
for step in range(steps):
    use_shared[0] = step // 2 % 2 == 1
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    out = ddp(inputs)
    torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1)).backward()
    optimizer.step()
    if step >= 6:
        times[use_shared[0]].append(time.perf_counter() - start)
if rank == 0:
    print(json.dumps({"gloo": statistics.median(times[False]), "shared": statistics.median(times[True])}))
dist.destroy_process_group()
"""


def one_run(script: Path, workload: str, steps: int, world: int = 2) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), workload, str(steps)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outs = [proc.communicate(timeout=1200) for proc in procs]
    for proc, (_, err) in zip(procs, outs):
        if proc.returncode != 0:
            raise SystemExit(f"a rank failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", default="resnet,gpt")
    parser.add_argument("--world", default="2", help="process counts, e.g. 2,4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "child.py"
        script.write_text(CHILD)
        for world, workload in [(int(w), k) for w in args.world.split(",") for k in args.workloads.split(",")]:
            for run in range(args.runs):
                got = one_run(script, workload, args.steps, world)
                print(
                    f"{workload}, {world} processes, run {run + 1}: gloo {got['gloo'] * 1e3:.1f} ms/step, "
                    f"shared memory {got['shared'] * 1e3:.1f} ms/step: {got['gloo'] / got['shared']:.3f}x steps/s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
