"""What is trained and how it is stepped: the model, its optimizer and its LR schedule.

Models by name: any torchvision classification model, or your own `module:factory`.

A factory is called as `factory(num_classes=N)` when it takes a `num_classes` argument (so
`torchvision.models:resnet50` works as one), else with no arguments. It must return an
nn.Module that maps a batch of images to logits of shape [batch, num_classes].
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from dist_jobs.errors import UsageError
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.batches import LossFn, classification_loss, language_model_loss

log = logging.getLogger(__name__)


def is_factory(spec: str) -> bool:
    return ":" in spec


def load_factory(spec: str, field: str) -> Callable[..., Any]:
    """Import `package.module:attr.path` and return the callable it names."""
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"{field}: cannot import module {module_name!r} of {spec!r}: {exc}",
            hint="make the module importable (install it, or add its folder to PYTHONPATH) or fix the name",
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(
                f"{field}: module {module_name!r} has no attribute {attr!r}",
                hint=f"write it as module:function, e.g. {module_name}:make",
            ) from None
    if not callable(obj):
        raise UsageError(
            f"{field}: {spec!r} is a {type(obj).__name__}, not a callable",
            hint="point it at a function or class that builds the object",
        )
    return obj


def default_loss(config: TrainConfig) -> LossFn:
    """The loss of the built-in workloads: next-token on `text` data, classification otherwise."""
    return language_model_loss if config.data == "text" else classification_loss


def build_model(name: str, num_classes: int, config: TrainConfig | None = None) -> nn.Module:
    """A freshly initialised model (no pretrained weights: the run trains it)."""
    if name == "gpt":
        from dist_jobs.train.lm import build_gpt  # the language model: loaded when asked for

        return build_gpt(config or TrainConfig())
    if is_factory(name):
        factory = load_factory(name, "model")
        model = factory(num_classes=num_classes) if takes(factory, "num_classes") else factory()
        if not isinstance(model, nn.Module):
            raise UsageError(
                f"model: {name!r} returned a {type(model).__name__}, not an nn.Module",
                hint="return the network itself from the factory",
            )
        return model
    import torchvision  # heavy (about 2 s): only when a torchvision model is asked for

    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        suggestion = f"did you mean {', '.join(close)}? " if close else ""
        raise UsageError(
            f"model: {name!r} is not a torchvision classification model",
            hint=f"{suggestion}see torchvision.models.list_models(), or pass module:factory for your own",
        )
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def takes(factory: Callable[..., Any], parameter: str) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: try the common convention
        return True
    return any(p.name == parameter or p.kind is p.VAR_KEYWORD for p in params)


def place(
    model: nn.Module, config: TrainConfig, device: torch.device, world_size: int, *, warn: bool
) -> tuple[nn.Module, nn.Module]:
    """(model on `device`, what the loop calls: DDP around it, or the model alone in a world of 1)."""
    on_gpu = device.type == "cuda"
    if config.sync_bn and world_size > 1 and on_gpu:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif config.sync_bn and world_size > 1 and warn:
        log.warning("sync_bn: SyncBatchNorm needs a GPU; this CPU run keeps per-rank BatchNorm")
    model = model.to(device)
    if world_size == 1:
        return model, model
    # deterministic: DDP rebuilds its gradient buckets after the first step, so a resumed run's
    # first step would all-reduce in another bucket layout than the uninterrupted run's did. The
    # ring all-reduce adds up each element in an order set by its offset, so with more than two
    # ranks that step differs in the last bit. find_unused_parameters turns the rebuild off (at
    # the cost of one autograd-graph walk per step, and a warning once per rank).
    # gradient_as_bucket_view: the gradients live in the all-reduce buckets, so no copy back out of
    # them after each step (the same arithmetic; its gain: BENCHMARKS.md).
    return model, DistributedDataParallel(
        model,
        device_ids=[device.index] if on_gpu else None,
        find_unused_parameters=config.deterministic,
        gradient_as_bucket_view=True,
    )


def build_optimizer(config: TrainConfig, model: nn.Module, world_size: int) -> torch.optim.Optimizer:
    """SGD (momentum) or AdamW; with scale_lr, lr is per 256 samples of the global batch."""
    lr = config.lr
    if config.scale_lr:
        lr *= config.batch_size * config.grad_accum * world_size / 256
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adamw":
        return _fused_if_possible(torch.optim.AdamW, params, lr=lr, weight_decay=config.weight_decay)
    if config.strategy == "fsdp":  # DTensor has no sharding rule for fused SGD: the foreach one
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay)
    return _fused_if_possible(
        torch.optim.SGD, params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def _fused_if_possible(
    kind: type[torch.optim.Optimizer], params: list[nn.Parameter], **kw: Any
) -> torch.optim.Optimizer:
    """The fused implementation where this torch has it for the parameters' device (CUDA; CPU since
    torch 2.4): one kernel pass per step instead of a Python loop over the parameters. It rounds
    differently in the last bit, so a run keeps one
    implementation throughout: resume.py keeps this choice over a checkpoint's."""
    try:
        return kind(params, fused=True, **kw)  # type: ignore[call-arg]
    except (TypeError, RuntimeError, ValueError):  # older torch, or no kernels for this device/dtype
        return kind(params, **kw)


def build_schedule(config: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> LambdaLR:
    """Linear warmup over warmup_steps, then cosine to 0, constant, or /10 at 1/3 and 2/3."""
    warmup, kind = config.warmup_steps, config.scheduler

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if kind == "step":
            return 0.1 ** min(int(progress * 3), 2)
        return 1.0

    return LambdaLR(optimizer, factor)


def seek_schedule(schedule: LambdaLR, step: int) -> None:
    """Put the schedule (and the optimizer's lr) at `step`, as if it had stepped there."""
    schedule.last_epoch = step
    for group, base, factor in zip(schedule.optimizer.param_groups, schedule.base_lrs, schedule.lr_lambdas):
        group["lr"] = base * factor(step)
