"""The state of one training run: what the loop advances and a checkpoint captures."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import signals
from dist_jobs.train.batches import LossFn
from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.distributed import Dist, FlagPoll
from dist_jobs.train.live import Live
from dist_jobs.train.metrics import Reporter
from dist_jobs.train.runlock import Guard
from dist_jobs.train.watchdog import Watchdog


@dataclass
class Position:
    epoch: int = 0
    batches: int = 0  # micro-batches each rank consumed in `epoch`
    step: int = 0  # optimizer steps; names the checkpoints, so it never goes back
    samples: int = 0  # samples all ranks consumed, whole run

    def done(self, config: TrainConfig) -> bool:
        """Whether training is over at this position: every epoch, or max_steps, reached."""
        return self.epoch >= config.epochs or (config.max_steps is not None and self.step >= config.max_steps)


@dataclass
class Run:
    config: TrainConfig
    dist: Dist
    flag: signals.PreemptFlag
    guard: Guard  # the run directory lock: fences every write, says when it was lost
    model: nn.Module  # unwrapped: what checkpoints hold and evaluation runs
    ddp: nn.Module  # DistributedDataParallel(model), or the model itself in a world of one
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    autocast: Callable[[], AbstractContextManager[Any]]
    loader: DataLoader
    eval_loader: DataLoader | None
    steps_per_epoch: int
    total_steps: int
    ckpt: Checkpointer | None
    reporter: Reporter
    poll: FlagPoll
    loss_fn: LossFn
    no_sync: Callable[[], AbstractContextManager[Any]]  # skips DDP's gradient all_reduce (accumulation)
    user_state: Mapping[str, Any]  # the caller's objects with state_dict()/load_state_dict()
    live: Live  # rank 0's progress.json and metrics.jsonl
    watchdog: Watchdog | None  # every rank's hang watchdog (None: train.hang_watchdog is off)
    pos: Position = field(default_factory=Position)
    metrics: dict[str, float] = field(default_factory=dict)
    last_save: float = field(default_factory=time.monotonic)
    saved_step: int = -1
