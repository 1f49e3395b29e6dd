"""The fallback: one process, rank 0 of 1 (a laptop run, `python -m dist_jobs.train`).

Falling back silently is dangerous where a launcher was clearly meant: a multi-task SLURM
batch script that forgot `srun`, or a hand-set WORLD_SIZE > 1. Those are refused unless
DIST_JOBS_ENV=single asks for exactly this.
"""

from __future__ import annotations

import os

from dist_jobs.errors import RankError
from dist_jobs.ranks import slurm
from dist_jobs.ranks.base import Environ, RankInfo, RankSource, env_int, master_port
from dist_jobs.ranks.ports import free_port

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
