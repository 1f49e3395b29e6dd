"""The training loop of `python -m dist_jobs.train`, and `fit()` for your own model and data.

Read top to bottom: fit() builds the run and resumes it, _train_epoch() is the hot loop, and
_boundary() runs between two optimizer steps to decide on checkpoints and preemption.

Resuming: a checkpoint holds the position (epoch, micro-batches consumed in it, steps, samples).
The resumed run slices the sampler's index list past the consumed batches (never loading
them) and restores every rank's RNG, so with deterministic settings it ends bit-identical to
an uninterrupted run. With another world size or batch size it resumes by global sample count
(data.ResumableSampler says why no sample of the epoch is skipped) and moves the LR schedule to
the matching point; the step counter keeps counting up, since it names the checkpoints.

Preemption: a signal sets a flag, all ranks agree at a step boundary, save a checkpoint, rank 0
writes `<checkpoint_dir>/<run>/PREEMPTED` once it is committed (a starting run removes it),
and every rank raises Preempted, whose exit code is dist_jobs.REQUEUE_EXIT_CODE.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from dist_jobs import REQUEUE_EXIT_CODE, __version__
from dist_jobs.errors import DistJobsError, UsageError
from dist_jobs.train import data, models, signals
from dist_jobs.train.checkpoint import (Checkpointer, CheckpointError, Loaded, rng_state,
                                        set_rng_state)
from dist_jobs.train.config import TrainConfig
from dist_jobs.train.distributed import Dist, FlagPoll, session
from dist_jobs.train.metrics import Meter, Reporter, evaluate

log = logging.getLogger("dist_jobs.train")
PREEMPTED = "PREEMPTED"


class Preempted(DistJobsError):
    """Raised on every rank once the preemption checkpoint is committed."""

    exit_code = REQUEUE_EXIT_CODE


@dataclass
class Position:
    epoch: int = 0
    batches: int = 0  # micro-batches each rank consumed in `epoch`
    step: int = 0  # optimizer steps; names the checkpoints, so it never goes back
    samples: int = 0  # samples all ranks consumed, whole run


@dataclass
class Run:
    config: TrainConfig
    dist: Dist
    flag: signals.PreemptFlag
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
    pos: Position = field(default_factory=Position)
    metrics: dict[str, float] = field(default_factory=dict)
    last_save: float = field(default_factory=time.monotonic)
    saved_step: int = -1


def fit(config: TrainConfig, model: nn.Module | None = None, train_data: Any = None,
        eval_data: Any = None) -> dict[str, float]:
    """Train `model` (default: config.model) on `train_data` (default: config.data).

    Returns the final metrics, the same on every rank. The model maps images to logits
    [batch, num_classes]; the data sets yield (image tensor, class index). Your own script
    should exit with a DistJobsError's exit_code, so a preempted run (200) gets requeued:
        try: fit(config, model, train_set, val_set)
        except DistJobsError as error: sys.exit(error.exit_code)
    """
    _seed(config.seed)  # the same model init on every rank
    if config.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = not config.deterministic
    with signals.PreemptFlag(config.preempt_signals) as flag, session(config) as dist:
        if train_data is None:
            train_data, built_eval = data.build_datasets(config)
            eval_data = built_eval if eval_data is None else eval_data
        if model is None:
            model = models.build_model(config.model, config.num_classes)
        run = _build(config, dist, flag, model, train_data, eval_data)
        try:
            _resume(run)
            return _train(run)
        finally:
            if run.ckpt is not None:
                run.ckpt.close()


def _build(c: TrainConfig, dist: Dist, flag: signals.PreemptFlag, model: nn.Module,
           train_data: Any, eval_data: Any) -> Run:
    on_gpu = dist.device.type == "cuda"
    if c.amp == "fp16" and not on_gpu:
        raise UsageError(f"amp: fp16 needs a CUDA GPU (GradScaler), this run is on {dist.device}",
                         hint="use --amp bf16 on CPU")
    model, ddp = models.place(model, c, dist.device, dist.world_size, warn=dist.is_main)
    where = {"rank": dist.rank, "world_size": dist.world_size, "pin_memory": on_gpu}
    loader = data.train_loader(train_data, c, **where)
    evaluating = eval_data is not None and c.eval_every_epoch
    held_out = data.eval_loader(eval_data, c, **where) if evaluating else None
    steps = data.steps_per_epoch(loader, c, dist.world_size)
    total = steps * c.epochs if c.max_steps is None else min(steps * c.epochs, c.max_steps)
    optimizer = models.build_optimizer(c, model, dist.world_size)
    folder = checkpoint_folder(c)
    if folder is not None and dist.is_main:
        (folder / PREEMPTED).unlink(missing_ok=True)  # this run is the requeued one
    ckpt = None if folder is None else Checkpointer(
        folder, rank=dist.rank, world_size=dist.world_size, keep=c.keep_checkpoints,
        async_write=c.async_checkpoint)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c.amp)
    board = (folder or Path("runs") / _run_name(c)) / "tensorboard" if c.tensorboard else None
    return Run(
        config=c, dist=dist, flag=flag, model=model, ddp=ddp, optimizer=optimizer,
        scheduler=models.build_schedule(c, optimizer, total),
        scaler=torch.amp.GradScaler(dist.device.type, enabled=c.amp == "fp16"),
        autocast=partial(torch.autocast, dist.device.type, dtype) if dtype else nullcontext,
        loader=loader, eval_loader=held_out, steps_per_epoch=steps, total_steps=total, ckpt=ckpt,
        reporter=Reporter(enabled=dist.is_main, progress=c.progress, tensorboard_dir=board,
                          total_steps=total),
        poll=FlagPoll(dist.control, 2))


def _resume(run: Run) -> None:
    """Load the newest checkpoint if any, then restore (or seed) this rank's RNG.

    It runs last before the loop: whatever draws random numbers after it (model init, say)
    would shift the stream that the uninterrupted run continued with.
    """
    if run.ckpt is not None and not run.config.resume:
        _refuse_old_checkpoints(run.ckpt.directory)
    loaded = run.ckpt.latest() if run.ckpt is not None and run.config.resume else None
    if loaded is not None:
        _load(run, loaded)
    if loaded is not None and loaded.rank_state is not None:
        set_rng_state(loaded.rank_state["rng"])
    else:  # a fresh start, or a rank the checkpoint's smaller world did not have
        _seed(run.config.seed + 7919 * (run.dist.rank + 1) + run.pos.step)


def _train(run: Run) -> dict[str, float]:
    c, pos = run.config, run.pos
    with run.reporter.start(pos.step):
        while pos.epoch < c.epochs and not _max_steps_reached(run):
            finished, train = _train_epoch(run)
            if run.eval_loader is not None:
                run.metrics.update(evaluate(run.model, run.eval_loader, run.dist.device,
                                            run.autocast))
            run.metrics.update({"train_" + k: v for k, v in train.items()})
            run.metrics.update(epoch=float(pos.epoch), step=float(pos.step))
            run.reporter.report(pos.step, "epoch", run.metrics, title=f"epoch {pos.epoch} done")
            if finished:
                pos.epoch, pos.batches = pos.epoch + 1, 0
        run.poll.drain()
        if run.ckpt is not None:
            if run.saved_step != pos.step:
                _save(run)
            run.ckpt.wait()
    return dict(run.metrics)


def _train_epoch(run: Run) -> tuple[bool, dict[str, float]]:
    """Train from run.pos to the end of its epoch; (False, ...) when max_steps ends it early."""
    c, pos, dist = run.config, run.pos, run.dist
    todo = run.steps_per_epoch * c.grad_accum - pos.batches
    if todo == 0:  # resumed at the epoch's last step: nothing left to train in it
        return True, {}
    data.start_epoch(run.loader, pos.epoch, skip_batches=pos.batches)
    meter = Meter(dist.device)
    samples_per_step = c.batch_size * c.grad_accum * dist.world_size
    batches = itertools.islice(run.loader, todo)
    for micro, (images, target) in enumerate(batches, start=1):
        images = images.to(dist.device, non_blocking=True)
        target = target.to(dist.device, non_blocking=True)
        last = micro % c.grad_accum == 0
        # Only the last micro-batch of an accumulation group all_reduces gradients.
        with nullcontext() if last or run.ddp is run.model else run.ddp.no_sync():
            with run.autocast():
                logits = run.ddp(images)
                loss = F.cross_entropy(logits, target)
            run.scaler.scale(loss / c.grad_accum).backward()
        meter.add(loss, logits, target)
        if not last:
            continue
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        run.scheduler.step()
        pos.batches, pos.step = pos.batches + c.grad_accum, pos.step + 1
        pos.samples += samples_per_step
        run.reporter.advance()
        if pos.step % c.log_every == 0:  # the only place the hot loop waits for numbers
            values = {**meter.reduce(), "lr": run.optimizer.param_groups[0]["lr"]}
            run.reporter.report(pos.step, "train", values,
                                title=f"step {pos.step}/{run.total_steps} epoch {pos.epoch} "
                                "train")
        _boundary(run)
        if _max_steps_reached(run):
            return False, meter.reduce()
    return True, meter.reduce()


def _boundary(run: Run) -> None:
    """Between optimizer steps: checkpoint when due, stop when any rank was told to."""
    c, pos = run.config, run.pos
    preempt, time_due = run.poll.result()  # what all ranks reported one boundary ago
    every = c.checkpoint_every_steps
    if run.ckpt is not None and (preempt or time_due or (every and pos.step % every == 0)):
        _save(run)
    if preempt:
        _stop(run)
    # Rank 0's clock alone decides time-based checkpoints, so all ranks save the same step.
    minutes = c.checkpoint_every_minutes
    due = bool(minutes and run.dist.is_main and time.monotonic() - run.last_save >= minutes * 60)
    run.poll.launch([bool(run.flag), due])


def _save(run: Run) -> None:
    assert run.ckpt is not None
    shared = _shared_state(run) if run.dist.is_main else None
    run.ckpt.save(run.pos.step, shared, {"rng": rng_state(), "rank": run.dist.rank})
    run.last_save, run.saved_step = time.monotonic(), run.pos.step


def _stop(run: Run) -> None:
    signal = run.flag.received
    by = signal.name if signal is not None else "a signal to another rank"
    if run.ckpt is not None:
        run.ckpt.wait()  # an asynchronous write must be committed before the marker says so
        if run.dist.is_main:
            tmp = run.ckpt.directory / f".{PREEMPTED}.tmp"
            tmp.write_text(f"{run.pos.step}\n")
            os.replace(tmp, run.ckpt.directory / PREEMPTED)
        saved = f"checkpoint step-{run.pos.step} in {run.ckpt.directory} is committed"
        hint = "requeue it with the same run name and checkpoint dir: it resumes from there"
    else:
        saved = "no checkpoint_dir is set, so nothing was saved"
        hint = "set DIST_JOBS_CHECKPOINT_DIR (or --checkpoint-dir) so a requeued run resumes"
    run.dist.barrier()  # leave together: launchers kill the rest when the first rank exits
    raise Preempted(f"preempted by {by} at step {run.pos.step}: {saved}; exiting with "
                    f"{REQUEUE_EXIT_CODE} to be requeued", hint=hint)


def _shared_state(run: Run) -> dict[str, Any]:
    """What every rank shares (rank 0 writes it). Plain types only: loaded with weights_only."""
    c, pos, world = run.config, run.pos, run.dist.world_size
    return {
        "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(), "scaler": run.scaler.state_dict(),
        "epoch": pos.epoch, "step": pos.step, "batches_in_epoch": pos.batches,
        "samples_in_epoch": pos.batches * c.batch_size * world, "samples_seen": pos.samples,
        "sampler_seed": run.loader.sampler.seed,  # type: ignore[attr-defined]
        "world_size": world, "global_batch": c.batch_size * c.grad_accum * world,
        "config": msgspec.to_builtins(c), "version": __version__, "metrics": dict(run.metrics),
    }


def _load(run: Run, loaded: Loaded) -> None:
    s, c, world = loaded.shared, run.config, run.dist.world_size
    try:
        run.model.load_state_dict(s["model"])
        run.optimizer.load_state_dict(s["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {loaded.path} does not fit this model and optimizer: "
                              f"{exc}", hint="it belongs to another model or optimizer: use another "
                              f"--run-name, or delete {loaded.path.parent} to start over") from exc
    if s["scaler"] and run.scaler.is_enabled():
        run.scaler.load_state_dict(s["scaler"])
    run.loader.sampler.seed = s["sampler_seed"]  # type: ignore[attr-defined]
    batches = data.resume_batches(s["samples_in_epoch"], c, world, run.steps_per_epoch)
    run.pos = Position(s["epoch"], batches, s["step"], s["samples_seen"])
    run.saved_step = loaded.step
    run.metrics.update(s["metrics"])
    schedule_step = s["epoch"] * run.steps_per_epoch + batches // c.grad_accum
    same_batch = s["global_batch"] == c.batch_size * c.grad_accum * world
    if same_batch and s["scheduler"]["last_epoch"] == schedule_step:
        run.scheduler.load_state_dict(s["scheduler"])
    else:
        models.seek_schedule(run.scheduler, schedule_step)
    if run.dist.is_main:
        log.info("resumed from %s: epoch %d, step %d of %d in it, step %d overall", loaded.path,
                 run.pos.epoch, batches // c.grad_accum, run.steps_per_epoch, run.pos.step)
        resumed_at = batches * c.batch_size * world
        if s["world_size"] != world or resumed_at != s["samples_in_epoch"]:
            log.info("it was written by %d ranks at sample %d of the epoch; %d ranks x batch %d "
                     "continue at sample %d", s["world_size"], s["samples_in_epoch"], world,
                     c.batch_size, resumed_at)


def _refuse_old_checkpoints(folder: Path) -> None:
    # Their step numbers would shadow this run's checkpoints, or keep it from writing them.
    old = sorted(p.name for p in folder.glob("step-*"))
    if old:
        raise UsageError(f"resume is off (--no-resume), but {folder} holds checkpoints of an "
                         f"earlier run ({', '.join(old)})", hint="use another --run-name, delete "
                         "that folder to start over, or drop --no-resume to continue it")


def checkpoint_folder(config: TrainConfig,
                      environ: Mapping[str, str] | None = None) -> Path | None:
    """`<checkpoint_dir or $DIST_JOBS_CHECKPOINT_DIR>/<run_name or $DIST_JOBS_RUN or default>`."""
    env = os.environ if environ is None else environ
    root = config.checkpoint_dir or env.get("DIST_JOBS_CHECKPOINT_DIR", "").strip()
    return Path(root).expanduser() / _run_name(config, env) if root else None


def _run_name(config: TrainConfig, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return config.run_name or env.get("DIST_JOBS_RUN", "").strip() or "default"


def _max_steps_reached(run: Run) -> bool:
    return run.config.max_steps is not None and run.pos.step >= run.config.max_steps


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(seed % 2**32)
