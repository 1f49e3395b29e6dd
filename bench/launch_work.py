"""The workloads of bench_launchers.py, written as each peer's users write them.

    python launch_work.py hand   resnet|gpt STEPS   (under torchrun: a hand-written DDP loop)
    python launch_work.py fabric resnet|gpt STEPS   (Lightning Fabric launches its own processes)
    --model launch_work:resnet18 / launch_work:gpt  (dist-jobs' built-in trainer, through the CLI)

Every side trains the same model on the same data (dist-jobs' FakeData 32x32 for ResNet-18, its
generated text for the GPT) with the same optimizer; rank 0's model stamps the start of every
training forward into $BENCH_STAMPS, so start-up and evaluation are left out of the rates.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SEED = 0
BATCH = 32
GPT = {"gpt_layers": 2, "gpt_heads": 4, "gpt_width": 128, "seq_len": 64, "text_chars": 400_000}


def _stamped(inner: Any) -> Any:
    from torch import nn

    class Stamped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.stamps: list[float] = []
            self.rank = -1
            if os.environ.get("BENCH_STAMPS"):
                atexit.register(self.dump)

        def forward(self, x: Any) -> Any:
            if self.training:
                if not self.stamps:  # every launcher names ranks its own way: ask the process group
                    import torch.distributed as dist

                    self.rank = dist.get_rank() if dist.is_initialized() else 0
                self.stamps.append(time.perf_counter())
            return self.inner(x)

        def dump(self) -> None:
            if self.stamps and self.rank == 0:
                Path(os.environ["BENCH_STAMPS"]).write_text(json.dumps(self.stamps))

    return Stamped()


def resnet18(num_classes: int = 10) -> Any:
    import torch
    import torchvision

    torch.manual_seed(SEED)
    return _stamped(torchvision.models.resnet18(num_classes=num_classes))


def gpt(num_classes: int = 0) -> Any:
    import torch

    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.lm import build_gpt

    torch.manual_seed(SEED)
    return _stamped(build_gpt(TrainConfig(**GPT)))  # type: ignore[arg-type]


def train_config(workload: str, steps: int) -> Any:
    from dist_jobs.spec.train import TrainConfig

    if workload == "gpt":
        return TrainConfig(
            model="gpt",
            data="text",
            batch_size=BATCH,
            optimizer="adamw",
            lr=3e-3,
            weight_decay=0.0,
            max_steps=steps,
            epochs=1000,
            **GPT,
        )  # type: ignore[arg-type]
    return TrainConfig(image_size=32, fake_samples=steps * BATCH * 2, batch_size=BATCH, epochs=1, seed=SEED)


def parts(workload: str, steps: int) -> tuple[Any, Any, Any]:
    """(model, train set, optimizer factory) as the built-in trainer would build them."""
    import torch

    from dist_jobs.train.data import build_datasets

    config = train_config(workload, steps)
    dataset = build_datasets(config)[0]
    model = gpt() if workload == "gpt" else resnet18()
    if workload == "gpt":
        return model, dataset, lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    return model, dataset, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)


def loss_of(workload: str, model: Any, batch: Any) -> Any:
    import torch.nn.functional as F

    inputs, target = batch
    out = model(inputs)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def hand(workload: str, steps: int) -> None:
    """A plain DDP loop in the style of pytorch/examples (torchrun sets the env:// variables)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    model, dataset, make_optimizer = parts(workload, steps)
    ddp = DDP(model)
    sampler = DistributedSampler(dataset, seed=SEED)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    optimizer = make_optimizer(ddp.parameters())
    done = 0
    for epoch in range(1000):
        sampler.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss_of(workload, ddp, batch).backward()
            optimizer.step()
            done += 1
            if done == steps:
                dist.destroy_process_group()
                return


def fabric(workload: str, steps: int) -> None:
    """The same loop on Lightning Fabric, as its docs write it (Fabric starts the processes)."""
    from lightning.fabric import Fabric
    from torch.utils.data import DataLoader

    runner = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    runner.launch()
    model, dataset, make_optimizer = parts(workload, steps)
    model, optimizer = runner.setup(model, make_optimizer(model.parameters()))
    loader = runner.setup_dataloaders(DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True))
    done = 0
    for _epoch in range(1000):
        for batch in loader:
            optimizer.zero_grad()
            runner.backward(loss_of(workload, model, batch))
            optimizer.step()
            done += 1
            if done == steps:
                return


if __name__ == "__main__":
    mode, workload, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"hand": hand, "fabric": fabric}[mode](workload, count)
