"""Gradient all-reduce through shared memory, for CPU ranks that all run on one host.

Gloo moves every DDP bucket through loopback TCP, a sizeable share of a CPU step, and gloo's
threads take CPU from the backward pass. Here each rank
writes its bucket into its slot of one arena in /dev/shm, already divided by the world size as
DDP's own hook divides it. After one barrier, every rank adds the slots up, in rank order, into
its own bucket. It is on by default (train.shm_allreduce) for CPU ranks that all share one host:
there it measured faster than gloo's all-reduce on an idle host; on a CPU-oversubscribed one it
did not, for a large model, and the spec turns it off (bench/bench_allreduce.py; BENCHMARKS.md).

The arithmetic is DDP's: (g0 / w) + (g1 / w) + ..., and with two ranks bit for bit what gloo gives.
Every rank gets the same bits whatever DDP's bucket layout, where gloo's ring, with more than
two ranks, adds each element in an order set by its offset.

The slots come in two sets: bucket k uses set k mod 2. That is why one barrier per bucket is
enough. A rank can write set A for bucket k+2 only after it passed the barrier of bucket k+1,
and every other rank reached that barrier only after it had read set A for bucket k.

It is used only when every rank proves it maps the same memory. Rank 0 creates the arena and
writes a random token into it, and every rank reads that token back. Ranks on other hosts, or
containers with a /dev/shm of their own, find no file or another token, and all ranks keep gloo.
The file is removed as soon as every rank has mapped it, and also when a peer is lost before
that (the collective fails on rank 0), so a crash leaves nothing behind.
Rank 0 takes at most half of the free space (DataLoader workers pass batches through /dev/shm
too) and reserves it with posix_fallocate: a tmpfs that filled up later would kill a rank with
SIGBUS in the middle of a step instead of failing here.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
import logging
import mmap
import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger("dist_jobs.train")

SHM = Path("/dev/shm")
_HEADER = 64  # the token; slots start on a cache line
_TOKEN_BYTES = 16


def slot_bytes(model: nn.Module, bucket_cap_bytes: int) -> int:
    """The largest bucket DDP can make: it closes a bucket once the bucket reaches its cap, so
    a bucket holds at most the cap plus one parameter, and never more than all of them."""
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    largest = min(sum(sizes), bucket_cap_bytes + max(sizes, default=0))
    return -(-largest // _HEADER) * _HEADER


class SharedReduce:
    """The hook's state: the arena, and which set of slots the next bucket uses."""

    def __init__(self, arena: torch.Tensor, rank: int, world: int, slot: int, group: Any) -> None:
        self.arena, self.rank, self.world, self.slot, self.group = arena, rank, world, slot, group
        self.next_set = 0

    def slot_of(self, which: int, rank: int, like: torch.Tensor) -> torch.Tensor:
        start = _HEADER + (which * self.world + rank) * self.slot
        return self.arena[start : start + like.numel() * like.element_size()].view(like.dtype)


def shared_mean(state: SharedReduce, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's comm hook: the bucket's mean over the ranks, through the shared arena."""
    buf = bucket.buffer()
    if buf.numel() * buf.element_size() > state.slot or buf.device.type != "cpu" or not buf.is_contiguous():
        # Never with DDP's own buckets; every rank sees the same bucket, so all take this path.
        return allreduce_hook(state.group, bucket)
    which, state.next_set = state.next_set, 1 - state.next_set
    torch.div(buf, state.world, out=state.slot_of(which, state.rank, buf))
    dist.barrier(group=state.group)
    slots = [state.slot_of(which, r, buf) for r in range(state.world)]
    torch.add(slots[0], slots[1], out=buf)
    for other in slots[2:]:
        buf.add_(other)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buf)
    return done


def attach(ddp: DistributedDataParallel, rank: int, world: int, timeout: timedelta, folder: Path = SHM) -> bool:
    """Give `ddp` the shared-memory all-reduce when every rank maps one arena in `folder`; call
    on every rank (it is a collective). False, and gloo as before, when they cannot."""
    state = open_arena(ddp, rank, world, timeout, folder)
    if state is not None:
        ddp.register_comm_hook(state, shared_mean)
    return state is not None


def open_arena(
    ddp: DistributedDataParallel, rank: int, world: int, timeout: timedelta, folder: Path = SHM
) -> SharedReduce | None:
    """The hook's state for an arena every rank has mapped, or None on every rank."""
    group: Any = dist.new_group(backend="gloo", timeout=timeout)  # every rank is a member
    slot = slot_bytes(ddp.module, int(ddp.bucket_bytes_cap))
    size = _HEADER + 2 * world * slot
    offer: list[Any] = _create(folder, size) if rank == 0 else [None, b"", ""]
    created = folder / offer[0] if offer[0] else None  # rank 0's alone
    try:
        dist.broadcast_object_list(offer, src=0, group=group)
        name, token, why = offer
        arena = _map(folder / name, size, token) if name else None  # this rank's own /dev/shm
        mapped = torch.tensor([int(arena is not None)], dtype=torch.int32)
        dist.all_reduce(mapped, op=dist.ReduceOp.MIN, group=group)
    finally:
        if created is not None:  # every rank has mapped it or given up, or a peer was lost
            created.unlink(missing_ok=True)
    if not mapped.item() or arena is None:
        if rank == 0:
            reason = why or "not every rank can map it: they run on more than one host"
            log.info("gradients: all-reduced by gloo, not through %s (%s)", folder, reason)
        return None
    if rank == 0:
        log.info("gradients: all-reduced through shared memory (%d ranks on this host, %.1f MB)", world, size / 1e6)
    return SharedReduce(arena, rank, world, slot, group)


def _create(folder: Path, size: int) -> list[Any]:
    """[file name, token, ""] for a new arena of `size` bytes, or [None, b"", why not]."""
    path = folder / f"dist-jobs-grads-{secrets.token_hex(8)}"
    token = secrets.token_bytes(_TOKEN_BYTES)
    try:
        fs = os.statvfs(folder)
        free = fs.f_bavail * fs.f_frsize
        if size > free // 2:  # DataLoader workers hand their batches over through /dev/shm too
            return [None, b"", f"{size / 1e6:.0f} MB is more than half of its {free / 1e6:.0f} MB free"]
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return [None, b"", f"cannot create a file there: {exc.strerror}"]
    try:
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, token, 0)
    except OSError as exc:
        path.unlink(missing_ok=True)
        return [None, b"", f"{size / 1e6:.0f} MB do not fit: {exc.strerror}"]
    finally:
        os.close(fd)
    return [path.name, token, ""]


def _map(path: Path, size: int, token: bytes) -> torch.Tensor | None:
    """The arena as a byte tensor, when `path` is the file rank 0 made (not one of another host)."""
    try:
        fd = os.open(path, os.O_RDWR)  # never O_CREAT: a file missing here means another host
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != size or os.pread(fd, _TOKEN_BYTES, 0) != token:
            return None
        memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        return None
    finally:
        os.close(fd)
    return torch.frombuffer(memory, dtype=torch.uint8)
