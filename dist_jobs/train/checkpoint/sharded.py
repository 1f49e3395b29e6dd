"""Sharded checkpoints (train.strategy fsdp): each rank writes its own shards through DCP.

Same run-directory format and protocol as checkpointer.py: `.step-<N>.partial/` gets the DCP files
(`__<rank>_0.distcp` per rank, `.metadata` from rank 0) next to `shared.pt` (position, schedule,
scaler, config: no tensors of the model) and each rank's `rank-<r>.pt` (its RNG, and the size and
CRC32 of the DCP files it wrote: latest() checks them, so a torn or flipped shard makes the ranks
fall back to the previous checkpoint); rank 0 writes COMPLETE and renames the folder once every
rank's part is in, fenced by the run-directory lock before each write. `shared.pt` says
`"format": "dcp"`.

Saving is collective (DCP gathers the ranks' write plans), over a gloo group of its own: an
asynchronous save (train.async_checkpoint, `dcp.async_save`) finishes on a thread while the
training thread runs collectives on the default group. With it, training is blocked only for
the copy of this rank's shards to CPU memory.

Loading goes through DCP too: each rank reads the byte ranges of its own shards, whatever world
size wrote them (resharding), and a DDP run loads one into its whole model (load_sharded says why
without DCP's planning collectives). A DDP checkpoint
(whole state in shared.pt) loads into an FSDP model by slicing each rank's part out of it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from dist_jobs.rundir.checkpoints import COMPLETE
from dist_jobs.rundir.lock import LockLost
from dist_jobs.train.checkpoint import write as disk
from dist_jobs.train.checkpoint.checkpointer import Agree, Checkpointer, CheckpointError

FORMAT = "dcp"
METADATA = ".metadata"


class ShardedCheckpointer(Checkpointer):
    """A Checkpointer whose save() also takes this rank's shards (`sharded`), written by DCP.

    Construct it on every rank (it creates its process group, a collective)."""

    def __init__(self, directory: Path, **kw: Any) -> None:
        super().__init__(directory, **kw)
        self.group: Any = dist.new_group(backend="gloo")
        self._shards: tuple[int, Future[Any] | dict[str, Any], Any] | None = None

    def save(
        self,
        step: int,
        shared: Mapping[str, Any] | None,
        rank_state: Mapping[str, Any],
        sharded: Mapping[str, Any] | None = None,
    ) -> None:
        if sharded is None:
            raise CheckpointError(f"step {step}: no sharded state given", hint="pass sharded_state(model, optimizer)")
        self.wait()
        if (self._folder(step) / COMPLETE).is_file() and step not in self._bad:
            return  # every rank sees the same committed folder: all skip this collective together
        partial = self._partial(step)
        self.fence(f"write rank {self.rank}'s shards of checkpoint step-{step}")
        partial.mkdir(parents=True, exist_ok=True)
        state = dict(sharded)
        writer = FileSystemWriter(partial, sync_files=False)  # Checksummed fsyncs each file
        writer.fs = Checksummed()
        if self.async_write:  # copies the shards to CPU now; the writing and DCP's gather run on a thread
            future = dcp.async_save(state, storage_writer=writer, process_group=self.group)
            self._shards = (step, future if isinstance(future, Future) else future.upload_completion, writer)
        else:
            self._shards = (step, state, writer)
        super().save(step, shared, rank_state)

    def _write_others(self, step: int) -> dict[str, dict[str, Any]]:
        """The shards (DCP's collective save), then the size and CRC32 of the files this rank
        wrote through DCP (its shards; rank 0 also the metadata), for its rank file: DCP's files
        carry no checksum of their own."""
        pending, self._shards = self._shards, None
        if pending is None or pending[0] != step:
            raise CheckpointError(f"step {step}: its shards were not staged", hint="call save() with sharded state")
        try:
            shards, writer = pending[1], pending[2]
            if isinstance(shards, Future):
                shards.result()
            else:
                dcp.save(shards, storage_writer=writer, process_group=self.group)
            return dict(writer.fs.digests)
        except (CheckpointError, LockLost):
            raise
        except Exception as exc:
            raise CheckpointError(
                f"writing the shards of checkpoint {self._folder(step)} failed: {exc}",
                hint="check the volume and every rank's log; the previous checkpoint is intact",
            ) from exc

    def close(self) -> None:
        super().close()
        if self._shards is not None and isinstance(self._shards[1], Future):
            self._shards[1].result()  # a save that never reached the writer: do not leave its thread behind


class Checksummed(FileSystem):
    """DCP's local file system, which also makes each file durable and notes its size and CRC32.

    The writer is built with sync_files=False: this fsyncs each file itself once DCP has closed it,
    and computes its CRC32 from the page cache while the fsync waits on the disk (disk.sync_digest),
    so vouching for the shards costs neither a second fsync nor CPU time on top of the write."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict[str, Any]] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            yield stream
        if "w" in mode:
            self.digests[Path(path).name] = disk.sync_digest(Path(path))

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)  # DCP writes its metadata under a temporary name first
        self.digests[Path(new_path).name] = self.digests.pop(Path(path).name)


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the model and optimizer state, keyed by parameter name (DTensors)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def load_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, keep: Any = None, agree: Agree | None = None
) -> None:
    """Load a DCP checkpoint into a sharded (FSDP) or whole (DDP) model and its optimizer, in place.

    `keep(optimizer, saved_state)` rewrites the loaded optimizer state before it is set (to keep
    this run's fused/foreach choice). Every rank calls it with `agree` (read.Agree).

    Each rank plans and reads its part alone (DCP's no_dist): DCP's collective planning would
    only gather the plans and hand each rank back its own (DefaultLoadPlanner, FileSystemReader),
    and latest() has already agreed on this checkpoint and verified its files. One all_reduce
    instead makes every rank fail when one could not read its part, as DCP's collectives would."""
    state = sharded_state(model, optimizer)
    failed: Exception | None = None
    try:
        load_alone(state, folder)
    except Exception as exc:
        failed = exc
    if agree is not None and agree([int(failed is not None)])[0] and failed is None:
        raise RuntimeError(f"another rank could not read its part of {folder} (its log says why)")
    if failed is not None:
        raise failed
    optim_state = keep(optimizer, state["optimizer"]) if keep else state["optimizer"]
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=optim_state)


def load_whole(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optim_state: dict) -> None:
    """A DDP checkpoint's whole state (every rank has read it) into a sharded model: each rank
    keeps its slices. The optimizer state is keyed by parameter index there, by name here."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name: dict[str, Any] = {
        "state": {names[i]: v for i, v in optim_state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]],
    }
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=by_name,
        options=StateDictOptions(full_state_dict=True),
    )


def is_sharded(shared: Mapping[str, Any]) -> bool:
    return shared.get("format") == FORMAT


def load_alone(state: dict[str, Any], folder: Path) -> None:
    """`dcp.load` into `state` by this process alone (no planning round with the other ranks, or
    none to have: `export`), without DCP's warning that no_dist means a single process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=folder, no_dist=True)
