"""Batches of any structure, and the loss functions `fit()` trains with.

A loss function is `loss(model, batch) -> Tensor` or `-> (Tensor, {name: value})`: the value to
minimise, and metrics that are averaged over samples and across ranks (one all_reduce at each
log line). A metric named `tokens` is summed instead and reported as `tokens_per_s`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dist_jobs.errors import UsageError

Metrics = dict[str, torch.Tensor | float]
LossFn = Callable[[nn.Module, Any], torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]]


def to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor in `batch` (tensor, tuple, list, dict, dataclass, namedtuple) moved to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch, **{f.name: to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch) if f.init}
        )
    return batch


def batch_size(batch: Any) -> int:
    """Samples in `batch`: the first dimension of the first tensor found in it."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        items: Any = batch.values()
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        items = (getattr(batch, f.name) for f in dataclasses.fields(batch))
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return 1
    for item in items:
        found = (
            batch_size(item)
            if isinstance(item, (torch.Tensor, Mapping, list, tuple)) or dataclasses.is_dataclass(item)
            else 0
        )
        if found:
            return found
    return 1


def call_loss(loss_fn: LossFn, model: nn.Module, batch: Any) -> tuple[torch.Tensor, Metrics]:
    """(loss, metrics) from a loss function that returns a tensor or a (tensor, metrics) pair."""
    result = loss_fn(model, batch)
    loss, metrics = result if isinstance(result, tuple) else (result, {})
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise UsageError(
            f"the loss function returned {type(loss).__name__}, not a scalar tensor",
            hint="return loss or (loss, {'metric': value}) with loss a 0-dim tensor",
        )
    return loss, dict(metrics)


def classification_loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, Metrics]:
    """The default: (inputs, class index) batches, cross-entropy and accuracy."""
    inputs, target = batch
    logits = model(inputs)
    return F.cross_entropy(logits, target), {"accuracy": (logits.argmax(dim=1) == target).float().mean()}


def language_model_loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, Metrics]:
    """(tokens, next tokens) batches of shape [batch, time]: next-token cross-entropy."""
    tokens, target = batch
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    accuracy = (logits.argmax(dim=-1) == target).float().mean()  # of the next character
    return loss, {"tokens": float(target.numel()), "accuracy": accuracy}
