"""`dist-jobs export RUN_DIR [--step N] -o model.pt`: one consolidated model state dict for inference.

Reads a committed checkpoint of the run directory (newest, or `--step N`), sharded (DCP, strategy
fsdp) or whole (DDP), and writes the model's weights only, keyed as `model.state_dict()` of the
unwrapped model, so `plain_model.load_state_dict(torch.load(path, weights_only=True))` works.
Nothing distributed is needed: it runs on any one machine that sees the run directory.

Memory: the sharded reader pulls the model's tensors from the shard files a group at a time
(at most `group_bytes` each; whole tensors), straight into the output dictionary; the optimizer
state (twice the model's size with AdamW) is never read. The peak is thus the model's weights
once (a `.pt` file is one pickle, written from memory) plus DCP's per-read buffers. A whole (DDP)
checkpoint's shared.pt is memory-mapped, and only its `model` entry is copied.

`.safetensors` needs the `safetensors` package; without it the export says so and stops (exit 2).

`python -m dist_jobs.train.checkpoint.export RUN_DIR [--step N] -o PATH` is what the CLI verb runs, so the
CLI itself never imports torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dist_jobs.errors import DistJobsError, UsageError
from dist_jobs.rundir.checkpoints import COMPLETE, committed_steps
from dist_jobs.train.checkpoint.checkpointer import Checkpointer, CheckpointError
from dist_jobs.train.checkpoint.read import FILES, load_verified, read_marker, verify_files
from dist_jobs.train.checkpoint.sharded import METADATA, is_sharded, load_alone

GROUP_BYTES = 256 << 20
_SUFFIXES = (".pt", ".pth", ".safetensors")


def export(run_dir: Path, output: Path, step: int | None = None, group_bytes: int = GROUP_BYTES) -> int:
    """Write the model of checkpoint `step` (default: newest) of `run_dir` to `output`; returns the step."""
    suffix = output.suffix.lower()
    if suffix not in _SUFFIXES:
        raise UsageError(
            f"-o {output}: unknown format {suffix or '(none)'}", hint="name it model.pt or model.safetensors"
        )
    if suffix == ".safetensors" and importlib.util.find_spec("safetensors") is None:
        raise UsageError(
            f"-o {output}: writing .safetensors needs the 'safetensors' package, which is not installed",
            hint="pip install safetensors, or write a .pt file instead (-o model.pt)",
        )
    step, folder, shared = _checkpoint(Path(run_dir), step)
    state = read_sharded(folder, group_bytes) if is_sharded(shared) else dict(shared["model"])
    _write(state, output, suffix)
    return step


def _checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path, dict[str, Any]]:
    steps = sorted(committed_steps(run_dir))
    if not steps:
        raise UsageError(f"RUN_DIR {run_dir}: holds no committed checkpoint", hint="give a run directory with step-N/")
    if step is not None and step not in steps:
        raise UsageError(f"--step {step}: no committed checkpoint step-{step} in {run_dir}", hint=f"one of {steps}")
    reader = Checkpointer(run_dir, rank=1, world_size=2)  # not rank 0: it removes nothing
    chosen = steps[-1] if step is None else step
    try:
        loaded = reader.load(chosen)
        if is_sharded(loaded.shared):
            _verify_even_ranks(loaded.path, loaded.world_size)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"checkpoint {run_dir / f'step-{chosen}'} cannot be exported: {exc}",
            hint=f"export another --step (committed: {steps})",
        ) from None
    return loaded.step, loaded.path, loaded.shared


def _verify_even_ranks(folder: Path, world: int) -> None:
    """load() as rank 1 of 2 checked the shards that ranks 1, 3, ... wrote: the others' here."""
    for rank in range(0, world, 2):
        record = read_marker(folder / COMPLETE, rank).mine or {}
        state = load_verified(folder / f"rank-{rank}.pt", record)
        verify_files(folder, state.get(FILES, {}) if isinstance(state, dict) else {}, f"rank-{rank}.pt")


def read_sharded(folder: Path, group_bytes: int = GROUP_BYTES) -> dict[str, torch.Tensor]:
    """The model's tensors of a DCP checkpoint, whole, read `group_bytes` at a time."""
    if not (folder / METADATA).is_file():
        raise UsageError(f"checkpoint {folder} has no {METADATA}", hint="it is damaged; export an older --step")
    reader = FileSystemReader(folder)
    entries = reader.read_metadata().state_dict_metadata
    out: dict[str, torch.Tensor] = {}
    group: dict[str, torch.Tensor] = {}
    size = 0
    for key, meta in entries.items():
        if not key.startswith("model.") or not isinstance(meta, TensorStorageMetadata):
            continue
        tensor = torch.empty(meta.size, dtype=meta.properties.dtype)
        group[key], size = tensor, size + tensor.numel() * tensor.element_size()
        if size >= group_bytes:
            _load_group(folder, group, out)
            group, size = {}, 0
    _load_group(folder, group, out)
    return out


def _load_group(folder: Path, group: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None:
    if group:
        load_alone(group, folder)
        out.update({key[len("model.") :]: tensor for key, tensor in group.items()})


def _write(state: dict[str, torch.Tensor], output: Path, suffix: str) -> None:
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        if suffix == ".safetensors":
            from safetensors.torch import save_file  # type: ignore[import-not-found]

            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
        else:
            torch.save(state, tmp)
        tmp.replace(output)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(
            f"-o {output}: cannot write there: {exc.strerror}", hint="check the path and free space"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dist-jobs export")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--step", type=int)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    try:
        step = export(Path(args.run_dir), Path(args.output), args.step)
    except DistJobsError as exc:
        print(f"dist-jobs export: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"exported the model of {Path(args.run_dir) / f'step-{step}'} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
