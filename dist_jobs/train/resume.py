"""Resume bookkeeping: what a checkpoint holds, how a run is restored from one, and where it lives.

A checkpoint holds the position (epoch, micro-batches consumed in it, steps, samples). The
resumed run slices the sampler's index list past the consumed batches (never loading them) and
restores every rank's RNG, so with deterministic settings it ends bit-identical to an
uninterrupted run. With another world size or batch size it resumes by global sample count
(data.ResumableSampler says why no sample of the epoch is skipped) and moves the LR schedule to
the matching point; the step counter keeps counting up, since it names the checkpoints.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import torch

from dist_jobs.constants import VERSION
from dist_jobs.errors import UsageError
from dist_jobs.rundir.place import RunDir
from dist_jobs.spec.paths import expand_home
from dist_jobs.spec.train import RUN_NAME, RUN_NAME_FIX, RUN_NAME_RULE, TrainConfig
from dist_jobs.train import data, models
from dist_jobs.train.checkpoint import sharded as dcp_format
from dist_jobs.train.checkpoint.checkpointer import CheckpointError, Loaded
from dist_jobs.train.distributed import max_over_ranks
from dist_jobs.train.rng import set_rng_state
from dist_jobs.train.state import Position, Run

log = logging.getLogger("dist_jobs.train")


def resume(run: Run) -> None:
    """Load the newest checkpoint if any, then restore (or seed) this rank's RNG.

    It runs last before the loop: whatever draws random numbers after it (model init, say)
    would shift the stream that the uninterrupted run continued with.
    """
    if run.ckpt is not None and not run.config.resume:
        refuse_old_checkpoints(run.ckpt.directory)
    agree = partial(max_over_ranks, group=run.dist.control)  # all ranks fall back together
    loaded = run.ckpt.latest(agree, accept=check_content) if run.ckpt is not None and run.config.resume else None
    if loaded is not None:
        _restore(run, loaded)
    if loaded is not None and loaded.rank_state is not None:
        set_rng_state(loaded.rank_state["rng"])
    else:  # a fresh start, or a rank the checkpoint's smaller world did not have
        seed_all(run.config.seed + 7919 * (run.dist.rank + 1) + run.pos.step)


def shared_state(run: Run) -> dict[str, Any]:
    """What every rank shares (rank 0 writes it). Plain types only: loaded with weights_only."""
    c, pos, world = run.config, run.pos, run.dist.world_size
    sharded = c.strategy == "fsdp"  # the model and optimizer go through DCP, each rank its shards
    return {
        "model": {} if sharded else run.model.state_dict(),
        "optimizer": {} if sharded else run.optimizer.state_dict(),
        "format": dcp_format.FORMAT if sharded else "whole",
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "epoch": pos.epoch,
        "step": pos.step,
        "batches_in_epoch": pos.batches,
        "samples_in_epoch": pos.batches * c.batch_size * world,
        "samples_seen": pos.samples,
        "sampler_seed": run.loader.sampler.seed,  # type: ignore[attr-defined]
        "world_size": world,
        "global_batch": c.batch_size * c.grad_accum * world,
        "config": msgspec.to_builtins(c),
        "version": VERSION,
        "metrics": dict(run.metrics),
        "user": {name: obj.state_dict() for name, obj in run.user_state.items()},
    }


# What _restore and the RNG restore read, with the type each must have.
_SHARED_TYPES = {
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
    "scaler": dict,
    "epoch": int,
    "step": int,
    "samples_in_epoch": int,
    "samples_seen": int,
    "sampler_seed": int,
    "world_size": int,
    "global_batch": int,
    "metrics": dict,
}


def check_content(loaded: Loaded) -> None:
    """A CheckpointError when the checkpoint lacks what resuming reads, so that latest() falls
    back to the previous one instead of the run failing half-way through restoring this one."""
    s, mine = loaded.shared, loaded.rank_state
    bad = [key for key, kind in _SHARED_TYPES.items() if not isinstance(s, dict) or not isinstance(s.get(key), kind)]
    if not bad and "last_epoch" not in s["scheduler"]:
        bad.append("scheduler.last_epoch")
    if mine is not None and (not isinstance(mine, dict) or "rng" not in mine):
        bad.append("rng (in this rank's file)")
    if not bad and dcp_format.is_sharded(s) and not (loaded.path / dcp_format.METADATA).is_file():
        bad.append(f"the shards' {dcp_format.METADATA}")
    if bad:
        raise CheckpointError(
            f"checkpoint {loaded.path} lacks {', '.join(bad)} (or holds the wrong type there)",
            hint="it was not written by this dist-jobs; the previous checkpoint is used if there is one",
        )


def _keeping_implementation(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """`saved` with this optimizer's implementation (fused/foreach) in place of the checkpoint's.

    A checkpoint from a torch without CPU fused kernels must not turn them off here, nor one with
    them turn them on where they are missing. Set before loading, so torch places the loaded
    state (Adam's step count: on the parameters' device when fused) for the implementation used."""
    chosen = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in optimizer.param_groups]
    groups = [{**group, **kept} for group, kept in zip(saved["param_groups"], chosen)]
    return {**saved, "param_groups": groups + saved["param_groups"][len(groups) :]}


def _restore(run: Run, loaded: Loaded) -> None:
    s, c, world = loaded.shared, run.config, run.dist.world_size
    _load_model(run, loaded)
    if s["scaler"] and run.scaler.is_enabled():
        run.scaler.load_state_dict(s["scaler"])
    _restore_user_state(run, s.get("user", {}), loaded)
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
        _say_resumed(run, loaded, batches)


def _say_resumed(run: Run, loaded: Loaded, batches: int) -> None:
    """Rank 0's line on what it resumed: where, or that the run had already finished."""
    s, c, world = loaded.shared, run.config, run.dist.world_size
    if run.pos.done(c):  # a rerun of a finished run: nothing to train, and not a resume to read as one
        log.info(
            "the run had already finished (%s, step %d): nothing to do; to train it further, raise "
            "train.epochs or train.max_steps, or give it another run name",
            loaded.path,
            run.pos.step,
        )
        return
    log.info(
        "resumed from %s: epoch %d, step %d of %d in it, step %d overall",
        loaded.path,
        run.pos.epoch,
        batches // c.grad_accum,
        run.steps_per_epoch,
        run.pos.step,
    )
    resumed_at = batches * c.batch_size * world
    if s["world_size"] != world or resumed_at != s["samples_in_epoch"]:
        log.info(
            "it was written by %d ranks at sample %d of the epoch; %d ranks x batch %d continue at sample %d",
            s["world_size"],
            s["samples_in_epoch"],
            world,
            c.batch_size,
            resumed_at,
        )


def _load_model(run: Run, loaded: Loaded) -> None:
    """The model and optimizer state: whole (DDP's) or sharded (DCP's), into either strategy."""
    s, model, optimizer = loaded.shared, run.model, run.optimizer
    try:
        if dcp_format.is_sharded(s):
            agree = partial(max_over_ranks, group=run.dist.control)
            dcp_format.load_sharded(model, optimizer, loaded.path, keep=_keeping_implementation, agree=agree)
        elif run.config.strategy == "fsdp":
            saved = _keeping_implementation(optimizer, s["optimizer"])
            dcp_format.load_whole(model, optimizer, s["model"], saved)
        else:
            model.load_state_dict(s["model"])
            optimizer.load_state_dict(_keeping_implementation(optimizer, s["optimizer"]))
            _own_memory(optimizer, s["optimizer"])
    except (RuntimeError, ValueError, KeyError, IndexError) as exc:
        raise CheckpointError(
            f"checkpoint {loaded.path} does not fit this model and optimizer: {exc}",
            hint="it belongs to another model or optimizer: use another "
            f"--run-name, or delete {loaded.path.parent} to start over",
        ) from exc


def _restore_user_state(run: Run, saved: dict[str, Any], loaded: Loaded) -> None:
    missing = sorted(set(run.user_state) - set(saved))
    if missing:
        raise CheckpointError(
            f"checkpoint {loaded.path} holds no state for {missing} (it has {sorted(saved)})",
            hint="pass the same `state=` objects to fit() as the run that wrote it, or use another --run-name",
        )
    for name, obj in run.user_state.items():
        obj.load_state_dict(saved[name])


def _own_memory(optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """Give memory of its own to optimizer state that torch kept as loaded (same device and dtype).

    A large checkpoint is loaded memory-mapped (checkpoint/read.py), so such a tensor still lives in the
    file's pages: training would keep the file mapped, and a pruned file could not be freed
    (NFS keeps it as .nfsXXXX). The copy costs what the first step's copy-on-write would.
    """
    loaded = {id(v) for s in saved.get("state", {}).values() for v in s.values() if isinstance(v, torch.Tensor)}
    for state in optimizer.state.values():
        for key, value in state.items():
            if id(value) in loaded:
                state[key] = value.clone()


def refuse_old_checkpoints(folder: Path) -> None:
    # Their step numbers would shadow this run's checkpoints, or keep it from writing them.
    old = sorted(p.name for p in folder.glob("step-*"))
    if old:
        raise UsageError(
            f"resume is off (--no-resume), but {folder} holds checkpoints of an earlier run ({', '.join(old)})",
            hint="use another --run-name, delete that folder to start over, or drop --no-resume to continue it",
        )


def checkpoint_folder(config: TrainConfig, environ: Mapping[str, str] | None = None) -> Path | None:
    """`<checkpoint_dir or $DIST_JOBS_CHECKPOINT_DIR>/<run_name or $DIST_JOBS_RUN or default>`.

    The root is taken as written (the batch script and the pod keep a trailing space or newline
    too); an existing root that is not a folder, and a run name that would leave the root
    (`../x`, `/abs`), are refused here: a TrainConfig built in Python or a hand-set
    $DIST_JOBS_RUN never went through the spec's checks.
    """
    env = os.environ if environ is None else environ
    from_env = env.get("DIST_JOBS_CHECKPOINT_DIR", "")
    root = config.checkpoint_dir or (from_env if from_env.strip() else "")
    if not root:
        return None
    folder = Path(expand_home(root))
    if folder.exists() and not folder.is_dir():
        raise UsageError(
            f"checkpoint directory {str(folder)!r} exists and is not a folder",
            hint="point --checkpoint-dir (checkpoint_dir in the job spec) at a folder, or remove that file",
        )
    return RunDir.at(folder, run_name(config, env)).path


def run_name(config: TrainConfig, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    name = config.run_name or env.get("DIST_JOBS_RUN", "").strip() or "default"
    if not re.fullmatch(RUN_NAME, name):
        where = "--run-name" if config.run_name else "$DIST_JOBS_RUN"
        raise UsageError(f"{where}={name!r} {RUN_NAME_RULE}", hint=RUN_NAME_FIX)
    return name


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np  # optional for torch: nothing to seed without it
    except ImportError:
        return
    np.random.seed(seed % 2**32)
