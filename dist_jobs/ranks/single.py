"""The fallback: one process, rank 0 of 1 (a laptop run, `python -m dist_jobs.train`).

Falling back silently is dangerous where a launcher was clearly meant: a multi-task SLURM
batch script that forgot `srun`, or a hand-set WORLD_SIZE > 1. Those are refused unless
DIST_JOBS_ENV=single asks for exactly this.
"""

from __future__ import annotations

import os
import socket

from dist_jobs.errors import RankError
from dist_jobs.ranks import slurm
from dist_jobs.ranks.base import Environ, RankInfo, RankSource, env_int, master_port
from dist_jobs.ranks.ports import derive_port

LOOPBACK = "127.0.0.1"


class SingleSource(RankSource):
    name = "single"
    required = ()
    variables = {"master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"}
    launch_hint = "set DIST_JOBS_ENV=single to run one process on purpose"

    def detect(self, environ: Environ) -> bool:
        return True

    def resolve(self, environ: Environ) -> RankInfo:
        if environ.get("DIST_JOBS_ENV", "").strip().lower() != self.name:
            _refuse_half_launched(environ)
        addr = environ.get("MASTER_ADDR", "").strip() or LOOPBACK
        if environ.get("MASTER_PORT", "").strip():
            port = master_port(environ, "MASTER_PORT")
        else:
            port = free_port(os.getpid())
        return RankInfo(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            num_nodes=1,
            master_addr=addr,
            master_port=port,
            source=self.name,
        )


def free_port(seed: int, attempts: int = 16) -> int:
    """A port derived from `seed` (the pid) that can be bound right now, outside ephemeral ports."""
    for attempt in range(attempts):
        port = derive_port(seed, attempt)
        if _bindable(port):
            return port
    # Everything tried is busy: return the first and let the bind error speak for itself.
    return derive_port(seed)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # TCPStore binds with SO_REUSEADDR, so a port in TIME_WAIT is fine for it too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _refuse_half_launched(environ: Environ) -> None:
    """Raise where one process is clearly not what the launch meant."""
    if slurm.in_allocation_without_step(environ):
        tasks = env_int(environ, "SLURM_NTASKS", "SLURM_NPROCS", minimum=1, default=1)
        nodes = env_int(environ, "SLURM_NNODES", "SLURM_JOB_NUM_NODES", minimum=1, default=1)
        if tasks > 1 or nodes > 1:
            job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
            raise RankError(
                f"this is the batch script or salloc shell of SLURM job {job} "
                f"(SLURM_NTASKS={tasks}, SLURM_NNODES={nodes}), not a task started by srun, "
                "so it has no rank in that world",
                hint=slurm.SRUN_HINT,
            )
    world = environ.get("WORLD_SIZE", "").strip()
    if world and world != "1":
        raise RankError(
            f"WORLD_SIZE={world!r} is set, but no launcher this project knows set it "
            "(no TORCHELASTIC_RUN_ID, SLURM step, PET_* or OMPI_* variables)",
            hint="launch with torchrun, or set DIST_JOBS_ENV=torchrun if RANK, LOCAL_RANK, "
            "WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT were set by hand",
        )
