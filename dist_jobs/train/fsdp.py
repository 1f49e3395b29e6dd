"""`train.strategy: fsdp`: the model sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each rank holds 1/W of the parameters, gradients and optimizer state: a block's parameters are
all-gathered just before its forward (and again for its backward) and freed after, and its
gradients are reduce-scattered. fully_shard goes on each block first, then on the root, so one
block is gathered at a time.

Blocks: the built-in GPT's transformer blocks, a ResNet's stages (layer1..layer4), or
`train.fsdp_policy`: module classes (every instance is a unit) or one `module:function(model)`
returning the submodules. Without any, the root is the only unit (the whole model is gathered
for each forward): it works, but saves memory on optimizer state only, so rank 0 warns.

A model still on the meta device (fit() builds the named models there under fsdp; a user may
pass one) is materialised after sharding: each rank allocates its shards only (`to_empty`) and
initialises them with each submodule's `reset_parameters()`, then the model's `init_weights()`
if it has one (see materialise: one parameter at a time is whole, never the model). Buffers
computed in __init__ that no reset_parameters() recreates must be recreated by init_weights().
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from dist_jobs.errors import UsageError
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import models

log = logging.getLogger(__name__)


def build(config: TrainConfig) -> nn.Module:
    """The named model, on the meta device: shapes only, no memory, until shard() places it."""
    with torch.device("meta"):
        return models.build_model(config.model, config.num_classes, config)


def shard(model: nn.Module, config: TrainConfig, device: torch.device, *, warn: bool) -> nn.Module:
    """fully_shard per block, then the root; materialised shard by shard if it is on meta."""
    if config.fsdp_cpu_offload and device.type != "cuda":
        raise UsageError(
            f"fsdp_cpu_offload: offloading needs a CUDA device (pinned memory), this run is on {device}",
            hint="drop --fsdp-cpu-offload on CPU runs: the shards are in CPU memory already",
        )
    units = blocks(model, config)
    if not units and warn:
        log.warning(
            "strategy fsdp: no blocks to shard one by one in %s; the root is the only unit (set train.fsdp_policy)",
            type(model).__name__,
        )
    options: dict[str, Any] = {"mp_policy": precision(config, root=False)}
    if config.fsdp_cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    on_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    if not on_meta:
        model = model.to(device)  # a user's materialised model: sharding frees all but this rank's part
    for unit in units:
        if config.activation_checkpointing:
            from torch.distributed._composable import checkpoint  # in place: the FQNs stay

            checkpoint(unit)
        fully_shard(unit, **options)
    options["mp_policy"] = precision(config, root=True)
    fully_shard(model, **options, reshard_after_forward=not units)
    if on_meta:
        materialise(model, device)
    return model


def precision(config: TrainConfig, *, root: bool) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction; the root's output (what the loss reads) in fp32.
    The blocks keep bf16 between them: the root's own layers compute in bf16 too."""
    if config.amp != "bf16":
        return MixedPrecisionPolicy()
    output = torch.float32 if root else None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=output)


def blocks(model: nn.Module, config: TrainConfig) -> list[nn.Module]:
    """The units to shard one by one, outermost first (never the root itself)."""
    if config.fsdp_policy:
        return _policy_units(model, config.fsdp_policy)
    found = getattr(model, "blocks", None)
    if isinstance(found, nn.ModuleList):  # the built-in GPT, and models shaped like it
        return list(found)
    stages = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(s, nn.Module) for s in stages):  # torchvision's ResNets
        return [s for s in stages if s is not None]
    return []


def _policy_units(model: nn.Module, policy: tuple[str, ...]) -> list[nn.Module]:
    targets = [models.load_factory(spec, "fsdp_policy") for spec in policy]
    classes = [t for t in targets if isinstance(t, type)]
    if len(classes) == len(targets):
        units = [m for m in model.modules() if m is not model and isinstance(m, tuple(classes))]
    elif len(targets) == 1:
        units = list(_call_policy(targets[0], model, policy[0]))
    else:
        raise UsageError(
            f"fsdp_policy: {','.join(policy)!r} mixes functions and classes",
            hint="give module classes (module:Class,module:Other), or one module:function(model)",
        )
    if not units:
        raise UsageError(
            f"fsdp_policy: {','.join(policy)!r} selects no submodule of {type(model).__name__}",
            hint="name the class of the model's blocks, or return them from the function",
        )
    return units


def _call_policy(function: Callable[..., Any], model: nn.Module, spec: str) -> list[nn.Module]:
    units = list(function(model))
    if not all(isinstance(u, nn.Module) and u is not model for u in units):
        raise UsageError(
            f"fsdp_policy: {spec!r} must return submodules of the model (not the model itself)",
            hint="return e.g. list(model.layers)",
        )
    return units


def materialise(model: nn.Module, device: torch.device) -> None:
    """Allocate this rank's shards (and the buffers) on `device`, then initialise them in place.

    Each submodule's reset_parameters() runs on whole-size stand-ins of its own parameters, one
    module at a time, and each rank keeps its slices: with the same seed, the initial model is
    the one a DDP run (or another world size) starts from. The model's `init_weights(fill=...)`
    then runs where it has one (the built-in GPT), through the same one-parameter-at-a-time fill.
    """
    model.to_empty(device=device)
    with torch.no_grad():
        for module in model.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                _reset_whole(module, reset)
        init = getattr(model, "init_weights", None)
        if callable(init):
            init(fill=fill_whole) if models.takes(init, "fill") else init()


def fill_whole(param: torch.Tensor, init: Callable[[torch.Tensor], Any]) -> None:
    """Run `init` on a whole-size tensor and keep this rank's slice of it in the sharded `param`."""
    if not isinstance(param, DTensor):
        init(param)
        return
    local = param.to_local()
    whole = torch.empty(param.shape, dtype=param.dtype, device=local.device)
    init(whole)
    mine = distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None).to_local()
    local.copy_(mine)


def _reset_whole(module: nn.Module, reset: Callable[[], Any]) -> None:
    sharded: dict[str, Any] = {n: p for n, p in module._parameters.items() if isinstance(p, DTensor)}
    if not sharded:
        reset()
        return
    stand_ins = {
        name: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device), requires_grad=False)
        for name, p in sharded.items()
    }
    module._parameters.update(stand_ins)
    try:
        reset()
    finally:
        module._parameters.update(sharded)  # the DTensor parameters, as fully_shard left them
    for name, param in sharded.items():
        fill_whole(param, _copier(stand_ins[name]))


def _copier(source: torch.Tensor) -> Callable[[torch.Tensor], Any]:
    return lambda whole: whole.copy_(source)


def no_sync(model: nn.Module) -> Callable[[], AbstractContextManager[Any]]:
    """Skip the gradient reduce-scatter (accumulation's non-last micro-batches)."""

    @contextmanager
    def skipping() -> Iterator[None]:
        assert isinstance(model, FSDPModule)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return skipping
