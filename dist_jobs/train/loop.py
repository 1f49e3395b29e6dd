"""The training loop of `python -m dist_jobs.train`, and `fit()` for your own model and data.

Read top to bottom: fit() builds the run and resumes it, _train_epoch() is the hot loop, and
_boundary() runs between two optimizer steps to decide on checkpoints and preemption.

Resuming is dist_jobs.train.resume's: what a checkpoint holds and how a run is restored.

Preemption: a signal sets a flag, all ranks agree at a step boundary, save a checkpoint, rank 0
writes `<checkpoint_dir>/<run>/PREEMPTED` once it is committed (a starting run removes it),
and every rank raises Preempted, whose exit code is dist_jobs.REQUEUE_EXIT_CODE.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dist_jobs.constants import PREEMPTED_MARKER, REQUEUE_EXIT_CODE
from dist_jobs.errors import Preempted, UsageError
from dist_jobs.rundir.hang import HANG_RECORD, job_id, write_preempted
from dist_jobs.rundir.lock import LOCK_NAME, LockLost, current
from dist_jobs.rundir.result import RESULT, write_result
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import data, flight, fsdp, live, models, shm_reduce, signals
from dist_jobs.train.batches import LossFn, batch_size, call_loss, to_device
from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.checkpoint.sharded import ShardedCheckpointer, sharded_state
from dist_jobs.train.distributed import Dist, FlagPoll, session
from dist_jobs.train.metrics import Meter, Reporter, evaluate
from dist_jobs.train.resume import checkpoint_folder, resume, run_name, seed_all, shared_state
from dist_jobs.train.rng import rng_state
from dist_jobs.train.runlock import Guard, run_lock
from dist_jobs.train.state import Run

log = logging.getLogger("dist_jobs.train")
PREEMPTED = PREEMPTED_MARKER


def fit(
    config: TrainConfig,
    model: nn.Module | None = None,
    train_data: Any = None,
    eval_data: Any = None,
    *,
    loss: LossFn | None = None,
    state: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Train `model` (default: config.model) on `train_data` (default: config.data).

    `loss(model, batch)` returns the loss, or (loss, {name: value}) with metrics to average over
    samples and ranks; batches may be tensors, tuples, dicts or dataclasses (moved to the device
    for you). The default is classification: (inputs, class index) batches, cross-entropy and
    accuracy (next-token cross-entropy for the built-in language model). Objects in `state` with
    state_dict()/load_state_dict() (an EMA, a data-loader cursor) are checkpointed and restored.

    Returns the final metrics, the same on every rank. Your own script should exit with a
    DistJobsError's exit_code, so a preempted run (200) gets requeued:
        try: fit(config, model, train_set, val_set, loss=my_loss)
        except DistJobsError as error: sys.exit(error.exit_code)
    """
    seed_all(config.seed)  # the same model init on every rank
    if config.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = not config.deterministic
    with (
        flight.armed(checkpoint_folder(config), job_id(), live.attempt_number()),  # before the process group
        signals.PreemptFlag(signals.preempt_signals(config.preempt_signals)) as flag,
        session(config) as dist,
        run_lock(checkpoint_folder(config), dist) as guard,
    ):
        if train_data is None:
            train_data, built_eval = data.build_datasets(config)
            eval_data = built_eval if eval_data is None else eval_data
        if model is None:
            sharding = config.strategy == "fsdp"  # on the meta device: no rank holds the whole model
            model = fsdp.build(config) if sharding else models.build_model(config.model, config.num_classes, config)
        loss_fn = loss or models.default_loss(config)
        run = _build(config, dist, flag, guard, model, train_data, eval_data, loss_fn, dict(state or {}))
        try:
            resume(run)
            watching: AbstractContextManager[Any] = run.watchdog or nullcontext()
            with watching:
                return _train(run)
        finally:
            run.live.close()  # the progress handed to its thread is written before the run ends
            if run.ckpt is not None:
                run.ckpt.close()


def _build(
    c: TrainConfig,
    dist: Dist,
    flag: signals.PreemptFlag,
    guard: Guard,
    model: nn.Module,
    train_data: Any,
    eval_data: Any,
    loss_fn: LossFn,
    user_state: dict[str, Any],
) -> Run:
    on_gpu = _check_amp(c, dist)
    model, ddp, no_sync = _place(c, dist, model, on_gpu)
    if c.compile:
        ddp = cast(nn.Module, torch.compile(ddp))
    loader, held_out = _loaders(c, dist, train_data, eval_data, on_gpu)
    steps = data.steps_per_epoch(loader, c, dist.world_size)
    total = steps * c.epochs if c.max_steps is None else min(steps * c.epochs, c.max_steps)
    optimizer = models.build_optimizer(c, model, dist.world_size)
    folder, ckpt = _checkpointer(c, dist, guard)
    # fsdp: its MixedPrecisionPolicy casts the parameters (fsdp.precision), no autocast
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c.amp) if c.strategy == "ddp" else None
    board = (folder or Path("runs") / run_name(c)) / "tensorboard" if c.tensorboard else None
    dog = live.watchdog(c, dist.rank, folder, dist.timeout.total_seconds(), guard, dist.world_size, dist.backend)
    return Run(
        config=c,
        dist=dist,
        flag=flag,
        guard=guard,
        model=model,
        ddp=ddp,
        optimizer=optimizer,
        scheduler=models.build_schedule(c, optimizer, total),
        scaler=torch.amp.GradScaler(dist.device.type, enabled=c.amp == "fp16"),
        autocast=partial(torch.autocast, dist.device.type, dtype) if dtype else nullcontext,
        loader=loader,
        eval_loader=held_out,
        steps_per_epoch=steps,
        total_steps=total,
        ckpt=ckpt,
        reporter=Reporter(
            enabled=dist.is_main, progress=c.progress, tensorboard_dir=board, total_steps=total, holds=guard.holds
        ),
        poll=FlagPoll(dist.control, 3),
        loss_fn=loss_fn,
        no_sync=no_sync,
        user_state=user_state,
        live=live.Live(folder if dist.is_main else None, total, live.attempt_number(), guard),
        watchdog=dog,
    )


def _place(c: TrainConfig, dist: Dist, model: nn.Module, on_gpu: bool) -> tuple[nn.Module, nn.Module, Any]:
    """(the model, what the loop calls, what skips the gradient sync): sharded, or DDP around it."""
    if c.strategy == "fsdp":
        model = fsdp.shard(model, c, dist.device, warn=dist.is_main)
        return model, model, fsdp.no_sync(model)
    model, ddp = models.place(model, c, dist.device, dist.world_size, warn=dist.is_main)
    if isinstance(ddp, DistributedDataParallel) and c.shm_allreduce and dist.backend == "gloo" and not on_gpu:
        shm_reduce.attach(ddp, dist.rank, dist.world_size, dist.timeout)
    return model, ddp, ddp.no_sync if isinstance(ddp, DistributedDataParallel) else nullcontext


def _loaders(c: TrainConfig, dist: Dist, train_data: Any, eval_data: Any, on_gpu: bool) -> tuple[Any, Any]:
    """This rank's training loader and held-out loader (None without eval data or evaluation)."""
    where: dict[str, Any] = {"rank": dist.rank, "world_size": dist.world_size, "pin_memory": on_gpu}
    evaluating = eval_data is not None and c.eval_every_epoch
    return data.train_loader(train_data, c, **where), data.eval_loader(eval_data, c, **where) if evaluating else None


def _check_amp(c: TrainConfig, dist: Dist) -> bool:
    """Whether the run is on a GPU; fp16 (GradScaler) needs one."""
    on_gpu = dist.device.type == "cuda"
    if c.amp == "fp16" and not on_gpu:
        raise UsageError(
            f"amp: fp16 needs a CUDA GPU (GradScaler), this run is on {dist.device}", hint="use --amp bf16 on CPU"
        )
    return on_gpu


def _checkpointer(c: TrainConfig, dist: Dist, guard: Guard) -> tuple[Path | None, Checkpointer | None]:
    folder = checkpoint_folder(c)
    if folder is None:
        return None, None
    keep, async_write = c.keep_checkpoints, c.async_checkpoint
    # First: it creates the folder, or says why it cannot.
    kind = ShardedCheckpointer if c.strategy == "fsdp" else Checkpointer
    ckpt = kind(
        folder,
        rank=dist.rank,
        world_size=dist.world_size,
        keep=keep,
        async_write=async_write,
        fence=guard.check,
        stamp=guard.stamp,
    )
    if dist.is_main:  # this run is the requeued one
        guard.check(f"remove {PREEMPTED} and {HANG_RECORD}")
        (folder / PREEMPTED).unlink(missing_ok=True)
        (folder / HANG_RECORD).unlink(missing_ok=True)
        # An earlier run's final metrics must not pass for this run's (Job.result()).
        guard.check(f"remove the previous {RESULT}")
        (folder / RESULT).unlink(missing_ok=True)
    return folder, ckpt


def _train(run: Run) -> dict[str, float]:
    c, pos = run.config, run.pos
    run.live.checkpoint_step = run.saved_step if run.saved_step >= 0 else None  # resumed from it
    run.live.start(pos.step)
    run.live.update(pos.step, pos.epoch, {})  # progress.json is this run's and attempt's from its start
    touch = run.watchdog.touch if run.watchdog is not None else None
    with run.reporter.start(pos.step):
        while not pos.done(c):
            finished, train = _train_epoch(run)
            if run.eval_loader is not None:
                held_out = evaluate(run.model, run.eval_loader, run.loss_fn, run.dist.device, run.autocast, touch)
                run.metrics.update(held_out)
                run.live.update(pos.step, pos.epoch, held_out)
            run.metrics.update({"train_" + k: v for k, v in train.items()})
            run.metrics.update(epoch=float(pos.epoch), step=float(pos.step))
            run.reporter.report(pos.step, "epoch", run.metrics, title=f"epoch {pos.epoch} done")
            if finished:
                pos.epoch, pos.batches = pos.epoch + 1, 0
        run.poll.drain()
        if run.ckpt is not None:
            began = time.monotonic()
            if run.saved_step != pos.step:
                _save(run, noted=False)
            with _paused(run):  # like every pause, left together: a paused rank's peers still beat
                run.ckpt.wait()
                run.dist.barrier()
            run.live.checkpoint_step = run.saved_step
            run.live.saved(pos.step, time.monotonic() - began)  # the last save, its write awaited
    folder = checkpoint_folder(c)
    if folder is not None and run.dist.is_main:  # what Job.result() reads once the job has ended
        run.live.update(pos.step, min(pos.epoch, c.epochs - 1), {}, finished=True)
        run.guard.check("write result.json")
        write_result(folder, run.metrics, run.guard.stamp)
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
    for micro, raw in enumerate(batches, start=1):
        batch = to_device(raw, dist.device)
        last = micro % c.grad_accum == 0
        # Only the last micro-batch of an accumulation group all_reduces gradients.
        with nullcontext() if last else run.no_sync():
            with run.autocast():
                loss, metrics = call_loss(run.loss_fn, run.ddp, batch)
            run.scaler.scale(loss / c.grad_accum).backward()
        meter.add(batch_size(batch), {"loss": loss, **metrics})
        if not last:
            continue
        if c.grad_clip is not None:
            run.scaler.unscale_(run.optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), c.grad_clip)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        run.scheduler.step()
        pos.batches, pos.step = pos.batches + c.grad_accum, pos.step + 1
        pos.samples += samples_per_step
        run.reporter.advance()
        if run.watchdog is not None:
            run.watchdog.beat(pos.step)
        if pos.step % c.log_every == 0:  # the only place the hot loop waits for numbers
            values = {**meter.interval(), "lr": run.optimizer.param_groups[0]["lr"]}
            run.reporter.report(
                pos.step, "train", values, title=f"step {pos.step}/{run.total_steps} epoch {pos.epoch} train"
            )
            run.live.update(pos.step, pos.epoch, values, wait=False)  # written on its own thread
        _boundary(run)
        if _max_steps_reached(run):
            return False, meter.reduce()
    return True, meter.reduce()


def _boundary(run: Run) -> None:
    """Between optimizer steps: checkpoint when due, stop when any rank was told to."""
    c, pos = run.config, run.pos
    run.live.stepped(pos.step)
    preempt, time_due, lost = run.poll.result()  # what all ranks reported one boundary ago
    if lost:  # rank 0 saw another run take the run directory over: stop, and save nothing
        _lock_lost(run)
    every = c.checkpoint_every_steps
    if run.ckpt is not None and (preempt or time_due or (every and pos.step % every == 0)):
        _save(run)
    if preempt:
        with _paused(run):  # rank 0 waits for the last write's commit, the others for rank 0
            _stop(run)
    # Rank 0's clock alone decides time-based checkpoints, so all ranks save the same step.
    minutes = c.checkpoint_every_minutes
    due = bool(minutes and run.dist.is_main and time.monotonic() - run.last_save >= minutes * 60)
    run.poll.launch([bool(run.flag), due, run.guard.lost.is_set()])


def _paused(run: Run) -> AbstractContextManager[Any]:
    """The watchdog off: a checkpoint takes as long as its bytes, whatever the step time."""
    return run.watchdog.paused() if run.watchdog is not None else nullcontext()


def _save(run: Run, noted: bool = True) -> None:
    """Checkpoint the current step, the watchdog paused; the ranks leave together: rank 0's part
    (the shared state, the commit) is the long one, and the other ranks would wait for it in the
    next step's collective with their watchdog on. `noted`: the ledger gets the time it held the loop."""
    began = time.monotonic()
    with _paused(run):
        _checkpoint(run)
        run.dist.barrier()
    if noted:
        run.live.saved(run.pos.step, time.monotonic() - began)


def _checkpoint(run: Run) -> None:
    assert run.ckpt is not None
    shared = shared_state(run) if run.dist.is_main else None
    previous = run.saved_step
    mine = {"rng": rng_state(), "rank": run.dist.rank}
    if isinstance(run.ckpt, ShardedCheckpointer):
        run.ckpt.save(run.pos.step, shared, mine, sharded_state(run.model, run.optimizer))
    else:
        run.ckpt.save(run.pos.step, shared, mine)
    # save() returns once this write is committed, or (async) the previous one is.
    committed = previous if run.ckpt.async_write else run.pos.step
    run.live.checkpoint_step = committed if committed >= 0 else run.live.checkpoint_step
    run.last_save, run.saved_step = time.monotonic(), run.pos.step


def _stop(run: Run) -> None:
    signal = run.flag.received
    by = signal.name if signal is not None else "a signal to another rank"
    if run.ckpt is not None:
        run.ckpt.wait()  # an asynchronous write must be committed before the marker says so
        if run.dist.is_main:
            run.guard.check(f"mark the run {PREEMPTED}")
            write_preempted(run.ckpt.directory, str(run.pos.step), run.guard.stamp)
        saved = f"checkpoint step-{run.pos.step} in {run.ckpt.directory} is committed"
        hint = "requeue it with the same run name and checkpoint dir: it resumes from there"
    else:
        saved = "no checkpoint_dir is set, so nothing was saved"
        hint = "set DIST_JOBS_CHECKPOINT_DIR (or --checkpoint-dir) so a requeued run resumes"
    run.dist.barrier()  # leave together: launchers kill the rest when the first rank exits
    raise Preempted(
        f"preempted by {by} at step {run.pos.step}: {saved}; exiting with {REQUEUE_EXIT_CODE} to be requeued", hint=hint
    )


def _lock_lost(run: Run) -> None:
    """Every rank leaves at the same boundary with the same error, writing nothing more."""
    assert run.ckpt is not None  # only a run with a run directory holds a lock
    run.dist.barrier()  # leave together: launchers kill the rest when the first rank exits
    folder = run.ckpt.directory  # an async write still in flight is fenced too: its commit is refused
    raise LockLost(folder, current(folder / LOCK_NAME), f"take step {run.pos.step + 1}")


def _max_steps_reached(run: Run) -> bool:
    return run.config.max_steps is not None and run.pos.step >= run.config.max_steps
