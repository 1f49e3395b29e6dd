"""Tasks started by `srun`: one process per rank, SLURM's variables give the whole picture.

Only a task of a real job step is a rank. The batch script itself (step `batch`), the
`extern` step and an `salloc` shell also carry SLURM_JOB_ID and often SLURM_PROCID=0, and
treating them as rank 0 of a world would make them wait forever for peers that srun never
started (Lightning's SLURMEnvironment has the same guard for interactive shells).
"""

from __future__ import annotations

import re

from dist_jobs.errors import RankError, UsageError
from dist_jobs.ranks import nodelist
from dist_jobs.ranks.base import Environ, RankInfo, RankSource, env_int, first, master_port, parse_int
from dist_jobs.ranks.ports import derive_port

# slurm.h: ids above SLURM_MAX_NORMAL_STEP_ID are the batch, extern, interactive and
# pending pseudo-steps (0xfffffffb.. since 20.11; 0xfffffffe was `batch` before that).
MAX_NORMAL_STEP_ID = 0xFFFFFFF0

STEP_ID_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")
JOB_ID_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
NTASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
NNODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")

SRUN_HINT = (
    "start one task per process with `srun python ...` inside the batch script "
    "(sbatch --nodes=N --ntasks-per-node=P), or one torchrun per node with "
    "`srun --ntasks-per-node=1 torchrun ...`"
)

_TASKS_ITEM = re.compile(r"\s*(\d+)(?:\(x(\d+)\))?\s*")


def step_id(environ: Environ) -> int | None:
    """The id of the srun step this process runs in; None for batch/extern/interactive or none."""
    name = first(environ, *STEP_ID_VARS)
    if name is None:
        return None
    text = environ[name].strip()
    # Some tools spell the pseudo-steps out ("batch", "extern", "interactive").
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= MAX_NORMAL_STEP_ID else None


def in_allocation_without_step(environ: Environ) -> bool:
    """True in a batch script or salloc shell: a SLURM job, but not a task started by srun."""
    return first(environ, *JOB_ID_VARS) is not None and step_id(environ) is None


def parse_tasks_per_node(name: str, value: str) -> list[tuple[int, int]]:
    """`2(x3),1` -> [(2, 3), (1, 1)]: (tasks, how many consecutive nodes have that many)."""
    pairs: list[tuple[int, int]] = []
    for item in value.split(","):
        match = _TASKS_ITEM.fullmatch(item)
        if match is None or int(match[2] or 1) < 1:
            raise RankError(
                f"{name}={value!r}: cannot read item {item!r} (expected forms like 4, 2(x3),1)",
                hint=f"unset {name} if it was set by hand; {SRUN_HINT}",
            )
        pairs.append((int(match[1]), int(match[2] or 1)))
    return pairs


def tasks_on_node(pairs: list[tuple[int, int]], node_index: int) -> int | None:
    """Tasks on the node at `node_index` (0-based), None when the list has no such node."""
    for tasks, repeat in pairs:
        if node_index < repeat:
            return tasks
        node_index -= repeat
    return None


class SlurmSource(RankSource):
    name = "slurm"
    required = (
        "SLURM_JOB_ID|SLURM_JOBID",
        "SLURM_STEP_ID|SLURM_STEPID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "|".join(NTASKS_VARS),
        "|".join(NNODES_VARS),
    )
    variables = {
        "rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "world_size": "SLURM_STEP_NUM_TASKS",
        "local_world_size": "SLURM_STEP_TASKS_PER_NODE",
        "node_rank": "SLURM_NODEID",
        "num_nodes": "SLURM_STEP_NUM_NODES",
        "master_addr": "MASTER_ADDR or the first host of SLURM_STEP_NODELIST",
        "master_port": "MASTER_PORT or derived from SLURM_JOB_ID/SLURM_STEP_ID",
    }
    launch_hint = SRUN_HINT

    def detect(self, environ: Environ) -> bool:
        # mpirun inside an allocation starts its daemons with srun; their SLURM_* (one task
        # per node) leak into the ranks, whose real identity is in OMPI_COMM_WORLD_*.
        return (
            step_id(environ) is not None
            and first(environ, *JOB_ID_VARS) is not None
            and "SLURM_PROCID" in environ
            and "OMPI_COMM_WORLD_RANK" not in environ
        )

    def resolve(self, environ: Environ) -> RankInfo:
        self.require(environ)
        step = step_id(environ)
        if step is None:
            name = first(environ, *STEP_ID_VARS) or STEP_ID_VARS[0]
            raise RankError(
                f"{name}={environ[name]!r} is the batch, extern or interactive step of the "
                "job, not a task started by srun, so it has no rank",
                hint=SRUN_HINT,
            )
        job_var = first(environ, *JOB_ID_VARS) or JOB_ID_VARS[0]
        job = parse_int(job_var, environ[job_var], hint=SRUN_HINT)
        world_size = env_int(environ, *NTASKS_VARS, minimum=1, hint=SRUN_HINT)
        num_nodes = env_int(environ, *NNODES_VARS, minimum=1, hint=SRUN_HINT)
        node_rank = env_int(environ, "SLURM_NODEID", hint=SRUN_HINT)
        return RankInfo(
            rank=env_int(environ, "SLURM_PROCID", hint=SRUN_HINT),
            local_rank=env_int(environ, "SLURM_LOCALID", hint=SRUN_HINT),
            world_size=world_size,
            local_world_size=_local_world_size(environ, node_rank, world_size, num_nodes),
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=_master_addr(environ),
            master_port=_master_port(environ, job, step),
            source=self.name,
        )


def _local_world_size(environ: Environ, node_rank: int, world_size: int, num_nodes: int) -> int:
    """Tasks on this node: uneven steps (`2(x3),1`) give different answers per node."""
    step_value = environ.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    if step_value:
        pairs = parse_tasks_per_node("SLURM_STEP_TASKS_PER_NODE", step_value)
        tasks = tasks_on_node(pairs, node_rank)
        if tasks is None:
            raise RankError(
                f"SLURM_NODEID={node_rank} but SLURM_STEP_TASKS_PER_NODE={step_value!r} lists fewer nodes",
                hint=SRUN_HINT,
            )
        return tasks
    # The job-level list describes the step only when the step spans the whole allocation.
    job_value = environ.get("SLURM_TASKS_PER_NODE", "").strip()
    if job_value:
        pairs = parse_tasks_per_node("SLURM_TASKS_PER_NODE", job_value)
        if sum(t * r for t, r in pairs) == world_size and sum(r for _, r in pairs) == num_nodes:
            tasks = tasks_on_node(pairs, node_rank)
            if tasks is not None:
                return tasks
    if world_size % num_nodes:
        raise RankError(
            f"{world_size} tasks over {num_nodes} nodes do not divide evenly and "
            "SLURM_STEP_TASKS_PER_NODE is not set, so this node's task count is unknown",
            hint="launch with srun --ntasks-per-node=P so that every node runs P tasks",
        )
    return world_size // num_nodes


def _master_addr(environ: Environ) -> str:
    if environ.get("MASTER_ADDR", "").strip():
        return environ["MASTER_ADDR"].strip()
    name = first(environ, *NODELIST_VARS)
    if name is None:
        raise RankError(
            f"neither MASTER_ADDR nor any of {', '.join(NODELIST_VARS)} is set",
            hint="export MASTER_ADDR=<first node's hostname> in the batch script",
        )
    try:
        return nodelist.head(environ[name])
    except UsageError as error:
        raise RankError(f"{name}: {error.message}", hint="export MASTER_ADDR=<first node>") from error


def _master_port(environ: Environ, job: int, step: int) -> int:
    if environ.get("MASTER_PORT", "").strip():
        return master_port(environ, "MASTER_PORT")
    try:
        return derive_port(job, step)
    except UsageError as error:
        raise RankError(error.message, hint=error.hint) from error
