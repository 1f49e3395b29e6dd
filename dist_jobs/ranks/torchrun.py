"""Processes started by torchrun (torch.distributed.run / torchelastic).

torchrun sets the full env:// set for each child itself, so it is trusted over anything it
runs inside: a SLURM step that runs one torchrun per node, or a PyTorchJob pod whose
PET_* variables torchrun has already consumed.
"""

from __future__ import annotations

from dist_jobs.ranks.base import Environ, RankInfo, RankSource, env_int, master_port


class TorchrunSource(RankSource):
    name = "torchrun"
    # GROUP_RANK is optional so that DIST_JOBS_ENV=torchrun also covers a hand-made env://
    # launch (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
    required = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE|ROLE_WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    variables = {
        "rank": "RANK",
        "local_rank": "LOCAL_RANK",
        "world_size": "WORLD_SIZE",
        "local_world_size": "LOCAL_WORLD_SIZE",
        "node_rank": "GROUP_RANK",
        "num_nodes": "GROUP_WORLD_SIZE",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT",
    }
    launch_hint = (
        "start the script with `torchrun --nnodes=N --nproc-per-node=P ... script.py`, which sets these for every child"
    )

    def detect(self, environ: Environ) -> bool:
        # torchrun always sets it (to the rdzv id, "none" by default); nothing else does.
        return "TORCHELASTIC_RUN_ID" in environ

    def resolve(self, environ: Environ) -> RankInfo:
        self.require(environ)
        hint = self.launch_hint
        world_size = env_int(environ, "WORLD_SIZE", "ROLE_WORLD_SIZE", minimum=1, hint=hint)
        local_world_size = env_int(environ, "LOCAL_WORLD_SIZE", minimum=1, hint=hint)
        rank = env_int(environ, "RANK", hint=hint)
        # Without GROUP_RANK/GROUP_WORLD_SIZE (hand-made env://), assume equal nodes.
        node_rank = env_int(environ, "GROUP_RANK", default=rank // local_world_size, hint=hint)
        num_nodes = env_int(
            environ,
            "GROUP_WORLD_SIZE",
            minimum=1,
            default=-(-world_size // local_world_size),
            hint=hint,
        )
        return RankInfo(
            rank=rank,
            local_rank=env_int(environ, "LOCAL_RANK", hint=hint),
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=environ["MASTER_ADDR"].strip(),
            master_port=master_port(environ, "MASTER_PORT", hint=hint),
            source=self.name,
        )
