"""FSDP2 as its tutorial shards a model by hand, for the benchmarks' hand-written baselines."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.distributed.fsdp import fully_shard


def shard_by_hand(model: Any, blocks: Iterable[Any]) -> Any:
    """fully_shard each block, then the root; the model was built on the meta device, so its
    parameters are allocated on the CPU (to_empty) and initialised (reset_parameters) after."""
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model
