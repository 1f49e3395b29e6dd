"""Processes started by Open MPI's mpirun (or another PMIx launcher that exports OMPI_*).

MPI says nothing about a rendezvous address, so MASTER_ADDR must come from the launch line.
The node index is derived as rank // local size, which holds only when ranks are placed
by slot with the same count on every node; other mappings are refused rather than guessed.
"""

from __future__ import annotations

import zlib

from dist_jobs.errors import RankError, UsageError
from dist_jobs.ranks.base import Environ, RankInfo, RankSource, env_int, first, master_port
from dist_jobs.ranks.ports import derive_port

# Identifiers shared by every rank of one mpirun, used to derive a port when none is given.
JOB_KEYS = ("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE")

MPIRUN_HINT = (
    "pass the rendezvous address on the launch line: "
    "`mpirun -np N --map-by ppr:P:node -x MASTER_ADDR=<first host> -x MASTER_PORT=29500 ...`"
)


class OpenMPISource(RankSource):
    name = "openmpi"
    required = (
        "OMPI_COMM_WORLD_RANK|PMIX_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MASTER_ADDR",
    )
    variables = {
        "rank": "OMPI_COMM_WORLD_RANK",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
        "world_size": "OMPI_COMM_WORLD_SIZE",
        "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
        "node_rank": "OMPI_COMM_WORLD_RANK // OMPI_COMM_WORLD_LOCAL_SIZE",
        "num_nodes": "OMPI_COMM_WORLD_SIZE // OMPI_COMM_WORLD_LOCAL_SIZE",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT or derived from the mpirun job id",
    }
    launch_hint = MPIRUN_HINT

    def detect(self, environ: Environ) -> bool:
        return first(environ, "OMPI_COMM_WORLD_RANK", "PMIX_RANK") is not None

    def resolve(self, environ: Environ) -> RankInfo:
        self.require(environ)
        hint = MPIRUN_HINT
        rank = env_int(environ, "OMPI_COMM_WORLD_RANK", "PMIX_RANK", hint=hint)
        world_size = env_int(environ, "OMPI_COMM_WORLD_SIZE", minimum=1, hint=hint)
        local_rank = env_int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", hint=hint)
        local_size = env_int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1, hint=hint)
        if rank % local_size != local_rank or world_size % local_size:
            raise RankError(
                f"OMPI_COMM_WORLD_RANK={rank} with OMPI_COMM_WORLD_LOCAL_RANK={local_rank}, "
                f"OMPI_COMM_WORLD_LOCAL_SIZE={local_size} and OMPI_COMM_WORLD_SIZE={world_size}: "
                "ranks are not placed by slot with the same count on every node, so the node "
                "index cannot be derived",
                hint="launch with `mpirun --map-by ppr:P:node` (P ranks on each node, in order)",
            )
        return RankInfo(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_size,
            node_rank=rank // local_size,
            num_nodes=world_size // local_size,
            master_addr=environ["MASTER_ADDR"].strip(),
            master_port=_port(environ),
            source=self.name,
        )


def _port(environ: Environ) -> int:
    if environ.get("MASTER_PORT", "").strip():
        return master_port(environ, "MASTER_PORT", hint=MPIRUN_HINT)
    key = first(environ, *JOB_KEYS)
    if key is None:
        raise RankError(
            f"MASTER_PORT is not set and none of {', '.join(JOB_KEYS)} identifies the mpirun job",
            hint=MPIRUN_HINT,
        )
    # The job id is a string in PMIx ("prterun-host-123@1"): a stable checksum makes it a number.
    try:
        return derive_port(zlib.crc32(environ[key].encode()))
    except UsageError as error:
        raise RankError(error.message, hint=error.hint) from error
