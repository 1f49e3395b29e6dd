"""Check a resolved rank against the job spec before init_process_group, and say what is off.

A wrong world size or a rank that maps to no GPU otherwise shows up as a rendezvous that
hangs until the timeout, or as 'invalid device ordinal' on one rank among hundreds. Every
mismatch is collected and raised as one RankError, each with the variables involved and a fix.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

from dist_jobs.envnum import env_number
from dist_jobs.errors import RankError, UsageError
from dist_jobs.ranks import SOURCES
from dist_jobs.ranks.base import DEBUG_HINT, RankInfo, parse_int

NODES_VAR = "DIST_JOBS_NNODES"
PROCS_VAR = "DIST_JOBS_NPROC_PER_NODE"
TIMEOUT_VAR = "DIST_JOBS_RDZV_TIMEOUT"
DEFAULT_RDZV_TIMEOUT = 300.0
RDZV_TIMEOUT_BOUNDS = (1.0, 86400.0)
PORT_BOUNDS = (1024, 65535)


@dataclass(frozen=True)
class _Expected:
    """What the spec asked for, and how to name where each number came from."""

    nodes: int | None
    procs: int | None
    nodes_label: str
    procs_label: str


def check(
    info: RankInfo,
    *,
    expected_nodes: int | None = None,
    expected_procs_per_node: int | None = None,
    environ: Mapping[str, str] | None = None,
    device_count: int | None = None,
    procs_per_device: int = 1,
    allow_loopback: bool = False,
) -> None:
    """Raise one RankError listing every inconsistency; return None when the launch is sound.

    `allow_loopback` accepts a loopback MASTER_ADDR in a multi-node world: only for tests
    that simulate several nodes on one host.
    """
    env = os.environ if environ is None else environ
    # `dist-jobs run --backend local` puts every "node" on this host: loopback is right there.
    allow_loopback = allow_loopback or env.get("DIST_JOBS_BACKEND") == "local"
    problems: list[tuple[str, str]] = []
    expected = _expected(env, expected_nodes, expected_procs_per_node, problems)
    problems += _shape_problems(info, expected)
    problems += _index_problems(info, expected)
    if device_count is not None:
        problems += _device_problems(info, env, device_count, procs_per_device)
    problems += _master_problems(info, expected, allow_loopback)
    if problems:
        raise _error(info, problems)


def device_index(info: RankInfo, environ: Mapping[str, str] | None = None, procs_per_device: int = 1) -> int:
    """The CUDA device this rank should use, counted among the devices it can see."""
    if procs_per_device < 1:
        raise UsageError(
            f"procs_per_device={procs_per_device} must be >= 1",
            hint="use 1 process per GPU unless you share GPUs on purpose",
        )
    env = os.environ if environ is None else environ
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    # SLURM with --gpus-per-task=1 (or gres binding) shows each task only its own GPU.
    if "CUDA_VISIBLE_DEVICES" in env and len(visible) == 1:
        return 0
    return info.local_rank // procs_per_device


def rendezvous_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds to wait for all ranks to join: DIST_JOBS_RDZV_TIMEOUT, default 300."""
    low, high = RDZV_TIMEOUT_BOUNDS
    try:
        value = env_number(TIMEOUT_VAR, DEFAULT_RDZV_TIMEOUT, environ, low=low, high=high)
    except ValueError as exc:
        raise RankError(
            f"{exc} (seconds)",
            hint=f"set {TIMEOUT_VAR}=600 (for example) or unset it for the default {DEFAULT_RDZV_TIMEOUT:g}",
        ) from None
    assert value is not None  # the default is a number
    return value


def _expected(
    env: Mapping[str, str], nodes: int | None, procs: int | None, problems: list[tuple[str, str]]
) -> _Expected:
    def from_env(name: str) -> int | None:
        text = env.get(name, "").strip()
        if not text:
            return None
        try:
            return parse_int(name, text, minimum=1)
        except RankError as error:
            problems.append((error.message, "the rendered job sets it from the spec; re-render the job or unset it"))
            return None

    return _Expected(
        nodes=nodes if nodes is not None else from_env(NODES_VAR),
        procs=procs if procs is not None else from_env(PROCS_VAR),
        nodes_label="expected_nodes" if nodes is not None else NODES_VAR,
        procs_label="expected_procs_per_node" if procs is not None else PROCS_VAR,
    )


def _shape_problems(info: RankInfo, want: _Expected) -> list[tuple[str, str]]:
    """World, node count and processes per node against the spec."""
    problems: list[tuple[str, str]] = []
    fix = _launch_fix(info, want)
    if want.nodes is not None and want.procs is not None and info.world_size != want.nodes * want.procs:
        problems.append(
            (
                f"world size {info.world_size} ({_var(info, 'world_size')}) != {want.nodes} nodes "
                f"({want.nodes_label}) x {want.procs} processes per node ({want.procs_label}) "
                f"= {want.nodes * want.procs}",
                fix,
            )
        )
    if want.nodes is not None and info.num_nodes != want.nodes:
        problems.append(
            (
                f"{info.num_nodes} nodes ({_var(info, 'num_nodes')}) but {want.nodes_label}={want.nodes}",
                fix,
            )
        )
    if want.procs is not None and info.local_world_size != want.procs:
        problems.append(
            (
                f"{info.local_world_size} processes on node {info.node_rank} "
                f"({_var(info, 'local_world_size')}) but {want.procs_label}={want.procs}",
                fix,
            )
        )
    return problems


def _index_problems(info: RankInfo, want: _Expected) -> list[tuple[str, str]]:
    """Ranks that cannot exist in the world they claim."""
    problems: list[tuple[str, str]] = []
    fix = f"the launcher's variables disagree with each other; {DEBUG_HINT}"
    if not 0 <= info.rank < info.world_size:
        problems.append(
            (
                f"rank {info.rank} ({_var(info, 'rank')}) is outside world size "
                f"{info.world_size} ({_var(info, 'world_size')})",
                fix,
            )
        )
    if not 0 <= info.local_rank < info.local_world_size:
        problems.append(
            (
                f"local rank {info.local_rank} ({_var(info, 'local_rank')}) is outside "
                f"local world size {info.local_world_size} "
                f"({_var(info, 'local_world_size')})",
                fix,
            )
        )
    # The spec-based variants add something only where the spec and the launch disagree.
    procs, nodes = want.procs, want.nodes
    if procs is not None and procs != info.local_world_size and info.local_rank >= procs:
        problems.append(
            (
                f"local rank {info.local_rank} ({_var(info, 'local_rank')}) but only "
                f"{want.procs} processes per node ({want.procs_label})",
                _launch_fix(info, want),
            )
        )
    if not 0 <= info.node_rank < info.num_nodes:
        problems.append(
            (
                f"node rank {info.node_rank} ({_var(info, 'node_rank')}) is outside "
                f"{info.num_nodes} nodes ({_var(info, 'num_nodes')})",
                fix,
            )
        )
    if nodes is not None and nodes != info.num_nodes and info.node_rank >= nodes:
        problems.append(
            (
                f"node rank {info.node_rank} ({_var(info, 'node_rank')}) but only "
                f"{want.nodes} nodes ({want.nodes_label})",
                _launch_fix(info, want),
            )
        )
    return problems


def _device_problems(
    info: RankInfo, env: Mapping[str, str], device_count: int, procs_per_device: int
) -> list[tuple[str, str]]:
    index = device_index(info, env, procs_per_device)
    if index < device_count:
        return []
    visible = env.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    sharing = f" // procs_per_device={procs_per_device}" if procs_per_device > 1 else ""
    needed = -(-max(info.local_world_size, info.local_rank + 1) // procs_per_device)
    return [
        (
            f"local rank {info.local_rank}{sharing} maps to GPU {index}, but this process sees "
            f"{device_count} GPU{'s' if device_count != 1 else ''} (CUDA_VISIBLE_DEVICES {shown})",
            f"request {needed} GPUs per node (sbatch --gpus-per-node={needed}, or "
            f"nvidia.com/gpu: {needed}), or set procs_per_node: {device_count * procs_per_device}",
        )
    ]


def _master_problems(info: RankInfo, want: _Expected, allow_loopback: bool) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    nodes = max(info.num_nodes, want.nodes or 1)
    if not info.master_addr.strip():
        problems.append(
            ("MASTER_ADDR is empty", "unset it to use the first node of the job, or set that node's hostname")
        )
    elif nodes > 1 and not allow_loopback and is_loopback(info.master_addr):
        problems.append(
            (
                f"MASTER_ADDR={info.master_addr} ({_var(info, 'master_addr')}) is this machine's "
                f"loopback, but the job spans {nodes} nodes: ranks on the other nodes would dial "
                "themselves and wait until the rendezvous timeout",
                "unset MASTER_ADDR so the first node of the allocation is used, or set it to that node's hostname",
            )
        )
    low, high = PORT_BOUNDS
    if not low <= info.master_port <= high:
        problems.append(
            (
                f"MASTER_PORT={info.master_port} ({_var(info, 'master_port')}) is outside {low}-{high}",
                f"unset MASTER_PORT to derive one, or pick a free port between {low} and {high}",
            )
        )
    return problems


def is_loopback(addr: str) -> bool:
    """localhost, 127.x.y.z, ::1 (also 0.0.0.0/::, which reach only the local host)."""
    host = addr.strip().strip("[]").lower()
    if host in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _launch_fix(info: RankInfo, want: _Expected) -> str:
    """How to make the launch match the spec, or the spec match the launch."""
    n = want.nodes or info.num_nodes
    p = want.procs or info.local_world_size
    spec = f"or set nodes: {info.num_nodes} and procs_per_node: {info.local_world_size} in the job spec"
    launch = {
        "slurm": f"launch with srun --nodes={n} --ntasks-per-node={p} (sbatch --nodes={n} --ntasks-per-node={p})",
        "torchrun": f"launch with torchrun --nnodes={n} --nproc-per-node={p}",
        "pytorchjob": f"run {n} pods with nprocPerNode: 1 (1 Master + {n - 1} Workers), or "
        f"torchrun --nproc-per-node={p} in each pod",
        "trainer": f"set numNodes: {n} in the TrainJob, or torchrun --nproc-per-node={p}",
        "openmpi": f"launch with mpirun -np {n * p} --map-by ppr:{p}:node",
    }.get(info.source, f"launch {n} x {p} processes with srun or torchrun")
    return f"{launch} {spec}"


def _var(info: RankInfo, field: str) -> str:
    source = SOURCES.get(info.source)
    return f"{info.source}: {source.describe(field)}" if source is not None else info.source


def _error(info: RankInfo, problems: list[tuple[str, str]]) -> RankError:
    head = (
        f"rank self-check failed for rank {info.rank} of {info.world_size} "
        f"(source {info.source}, node {info.node_rank}, local rank {info.local_rank})"
    )
    if len(problems) == 1:
        text, fix = problems[0]
        error = RankError(f"{head}: {text}", hint=fix)
    else:
        lines = [f"{head}: {len(problems)} problems"]
        lines += [f"  - {text}\n    fix: {fix}" for text, fix in problems]
        error = RankError("\n".join(lines), hint=f"fix them together; {DEBUG_HINT}")
    error.problems = [text for text, _ in problems]  # type: ignore[attr-defined]
    return error
