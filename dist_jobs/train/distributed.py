"""Process group set-up: who am I, which device, which backend, and agreeing without stalling.

Rank resolution and the self-check run before torch.distributed is touched, so a bad launch
fails in milliseconds with a RankError instead of waiting in rendezvous. Every collective has
a bounded timeout (DIST_JOBS_RDZV_TIMEOUT, default 300 s): a rank whose peer died raises
instead of hanging. That failure, in rendezvous or in a collective, becomes PeerLost, whose exit
code is the retryable REQUEUE_EXIT_CODE: a node loss or an OOM kill gives the survivors no
warning, and exiting 1 (permanent) would fail a job the scheduler can restart and resume.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.envnum import env_number
from dist_jobs.errors import DistJobsError, UsageError
from dist_jobs.ranks import RankInfo, resolve
from dist_jobs.ranks.selfcheck import check, device_index, rendezvous_timeout
from dist_jobs.spec.train import TrainConfig


@dataclass(frozen=True)
class Dist:
    """This process's place in the job and the groups it talks through."""

    info: RankInfo
    device: torch.device
    backend: str
    # A gloo group for small CPU-side decisions (preemption, time-based checkpoints): with
    # NCCL, reading a flag that lives on the GPU would synchronize the stream every step.
    control: Any
    timeout: timedelta  # each collective's limit (collective_timeout)

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def is_main(self) -> bool:
        return self.info.rank == 0

    def barrier(self) -> None:
        dist.barrier(group=self.control)


def simulated_nodes(environ: Mapping[str, str]) -> bool:
    """`dist-jobs run --backend local` plays several nodes on one host, all on loopback."""
    return environ.get("DIST_JOBS_BACKEND", "").strip() == "local"


def pick_device(config: TrainConfig, info: RankInfo, environ: Mapping[str, str]) -> torch.device:
    """cuda:<index from the self-check's mapping> when asked for or available, else cpu."""
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(
            "device: 'cuda' was asked for, but this process sees no CUDA GPU",
            hint="request GPUs from the scheduler, or set device: auto (or cpu)",
        )
    return torch.device("cuda", device_index(info, environ, config.procs_per_device))


def backend_for(device: torch.device, procs_per_device: int) -> str:
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so shared GPUs use gloo.
    return "nccl" if device.type == "cuda" and procs_per_device == 1 else "gloo"


class PeerLost(DistJobsError):
    """A rendezvous or collective failed because a peer vanished: retryable, the gang restarts."""

    exit_code = REQUEUE_EXIT_CODE


# What gloo (transport/tcp/pair.cc), NCCL and the TCPStore say when the other end is gone or silent.
_GONE = ("connection reset", "connection closed", "broken pipe", "read error", "write error", "timed out", "abort")
_DISTRIBUTED = ("gloo", "nccl", "c10d", "processgroup", "tcpstore")


def peer_lost(exc: BaseException) -> bool:
    """True for a torch.distributed error a vanished (dead, killed, unreachable) peer causes."""
    if isinstance(exc, dist.DistError):  # DistStoreError, DistNetworkError, DistBackendError
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(d in text for d in _DISTRIBUTED) and any(g in text for g in _GONE)


def _as_peer_lost(exc: BaseException, rank: int) -> PeerLost:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return PeerLost(
        f"rank {rank} lost a peer ({type(exc).__name__}: {first}); exiting with {REQUEUE_EXIT_CODE} so the "
        "scheduler restarts the job, which resumes from its last checkpoint",
        hint="a peer process died or its node went away: its own log says why (an OOM kill, a node failure)",
    )


@contextmanager
def session(config: TrainConfig, environ: Mapping[str, str] | None = None) -> Iterator[Dist]:
    """Resolve, self-check, init the process group; destroy it on the way out, error or not."""
    env = os.environ if environ is None else environ
    info = resolve(env)
    device = pick_device(config, info, env)
    gpus = torch.cuda.device_count() if device.type == "cuda" else None
    check(
        info,
        environ=env,
        device_count=gpus,
        procs_per_device=config.procs_per_device,
        allow_loopback=simulated_nodes(env),
    )
    backend = backend_for(device, config.procs_per_device)
    timeout = timedelta(seconds=rendezvous_timeout(env))
    if device.type == "cuda":
        if config.deterministic:  # cuBLAS reads it when the context is created
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(device)
    try:
        _init_process_group(info, backend, device, timeout)
    except Exception as exc:
        if peer_lost(exc):
            raise _as_peer_lost(exc, info.rank) from exc
        raise
    collectives = collective_timeout(config, timeout, env)
    setter = getattr(dist, "set_timeout", None) or getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is not None and collectives != timeout:  # torch >= 2.3; older ones keep the rendezvous one
        setter(collectives)
        timeout = collectives
    atexit.unregister(_let_gloo_workers_finish)  # once per process, however many sessions
    atexit.register(_let_gloo_workers_finish)
    try:
        control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        yield Dist(info=info, device=device, backend=backend, control=control, timeout=timeout)
    except Exception as exc:
        if peer_lost(exc):
            raise _as_peer_lost(exc, info.rank) from exc
        raise
    finally:
        dist.destroy_process_group()


def collective_timeout(config: TrainConfig, rendezvous: timedelta, env: Mapping[str, str]) -> timedelta:
    """Every collective's limit once the group is up: NCCL with TORCH_NCCL_ASYNC_ERROR_HANDLING
    (job_env) turns one that waits longer into an error instead of a hang. train.collective_timeout,
    else $DIST_JOBS_COLLECTIVE_TIMEOUT (the job's templates set it), else twice the hang
    watchdog's floor (never below the rendezvous timeout): the watchdog, which dumps the stacks
    and exits with the requeue code, fires first. The rendezvous keeps its own timeout."""
    floor = 2 * config.hang_min_seconds if config.hang_watchdog else 0.0
    seconds = config.collective_timeout or _seconds(env)
    return timedelta(seconds=seconds or max(rendezvous.total_seconds(), floor))


def _seconds(env: Mapping[str, str]) -> float | None:
    """$DIST_JOBS_COLLECTIVE_TIMEOUT when it is a positive number; else None (the default applies)."""
    try:
        return env_number("DIST_JOBS_COLLECTIVE_TIMEOUT", None, env, low=1e-9)
    except ValueError:
        return None


def _init_process_group(info: RankInfo, backend: str, device: torch.device, timeout: timedelta) -> None:
    extra: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    if info.world_size == 1:
        # No peer to meet: an in-process store needs no free port and no network.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **extra)
        return
    info.export()  # env:// reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    dist.init_process_group(
        backend, init_method="env://", rank=info.rank, world_size=info.world_size, timeout=timeout, **extra
    )


# gloo's worker thread drops its reference to a collective's tensors just after the caller's
# wait() returns. If that reference is the last one, freeing the Python tensor object needs the
# GIL; a worker still waiting for it when the interpreter shuts down is killed mid-destructor,
# and the process aborts ("terminate called without an active exception", SIGABRT) instead of
# exiting 0. DDP keeps the process group (and so the workers) alive until exit whatever
# destroy_process_group does. Two defences: tensors we reduce stay referenced from Python, so
# the worker's drop is not the last; and at exit, before the interpreter starts finalizing, the
# GIL is released for a moment so a worker freeing DDP's own tensors can finish.
_RECENT: deque[torch.Tensor] = deque(maxlen=16)
_EXIT_GRACE_S = 0.05


def _let_gloo_workers_finish() -> None:
    time.sleep(_EXIT_GRACE_S)


def all_reduce(tensor: torch.Tensor, *, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
    """dist.all_reduce that keeps `tensor` alive past the worker thread's use of it."""
    _RECENT.append(tensor)
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def max_over_ranks(values: Sequence[int], group: Any = None) -> list[int]:
    """Element-wise maximum over all ranks, on the CPU control group (checkpoint agreement)."""
    tensor = torch.tensor(list(values), dtype=torch.int64)
    all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in tensor.tolist()]


class FlagPoll:
    """All ranks agree on a few booleans (any rank's True wins) without stalling a step.

    `launch(flags)` starts an asynchronous all_reduce(MAX) and returns at once; `result()`, called
    at the next step boundary, collects it. A whole step has passed by then, so the wait is
    free, and every rank reads the same values at the same boundary. The price is one step of
    latency: a signal that lands during step k is acted on after step k+1, so a preempted job
    loses no work at all (it checkpoints), it only runs one step longer before stopping.
    """

    def __init__(self, group: Any, size: int) -> None:
        self._group = group
        self._size = size
        self._buffer = torch.zeros(size, dtype=torch.int32)
        self._work: Any = None

    def launch(self, flags: Sequence[bool]) -> None:
        # A fresh tensor: the one in flight belongs to the collective until it completes.
        self._buffer = torch.tensor([int(f) for f in flags], dtype=torch.int32)
        self._work = all_reduce(self._buffer, op=dist.ReduceOp.MAX, group=self._group, async_op=True)

    def result(self) -> list[bool]:
        if self._work is None:
            return [False] * self._size
        self._work.wait()
        self._work = None
        return [bool(v) for v in self._buffer.tolist()]

    def drain(self) -> None:
        """Complete the collective in flight: required before the group is destroyed."""
        self.result()


def collectives_entered() -> int | None:
    """How many collectives this rank has enqueued over all its process groups, from the c10d
    flight recorder's per-group counters (kept even when its trace buffer is off; gloo's and
    NCCL's are dumped apart), or None where this torch has none. Read from the watchdog thread
    while the training thread may be blocked in a collective: a dump takes only the recorder's lock."""
    try:
        from torch._C import _distributed_c10d as c10d  # a torch built without distributed lacks it
    except ImportError:
        return None
    total, seen = 0, False
    for dump in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        try:
            status = json.loads(getattr(c10d, dump)(includeCollectives=False, onlyActive=True)).get("pg_status", {})
            counts = [int(group.get("last_enqueued_collective", -1)) for group in status.values()]
        except (AttributeError, RuntimeError, TypeError, ValueError):
            continue
        total, seen = total + sum(max(count, 0) for count in counts), seen or bool(counts)
    return total if seen else None
