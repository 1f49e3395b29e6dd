"""Pods of a Kubeflow PyTorchJob (training-operator v1) or TrainJob (Trainer v2), python per pod.

The v1 operator sets RANK to the *pod* index and WORLD_SIZE to pods x nprocPerNode. That is a
correct env:// world only when each pod runs exactly one process: nprocPerNode 1, or a
non-integer ("auto", unset), which the operator counts as 1. With nprocPerNode 8 and plain
`python train.py`, WORLD_SIZE counts processes that are never started and the rendezvous
hangs, so that case is refused with a hint to run torchrun, which reads the PET_* variables.
Trainer v2 sets only PET_* (no RANK/WORLD_SIZE); with one process per node they say it all.
"""

from __future__ import annotations

from dist_jobs.errors import RankError
from dist_jobs.ranks.base import Environ, RankInfo, RankSource, env_int, first, master_port

MARKERS = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR")

TORCHRUN_HINT = (
    "run `torchrun script.py` as the container command (torchrun reads PET_NNODES, "
    "PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT), "
    "or set nprocPerNode: 1 to run one python process per pod"
)


def nproc_per_node(environ: Environ) -> int:
    """Processes per pod as the operator counted them: an integer, else ("auto", unset) 1."""
    value = environ.get("PET_NPROC_PER_NODE", "").strip()
    if value.isascii() and value.isdigit():
        return int(value)
    return 1


def _under_operator(environ: Environ) -> bool:
    # torchrun consumes PET_* and sets TORCHELASTIC_RUN_ID for its children.
    return "TORCHELASTIC_RUN_ID" not in environ and first(environ, *MARKERS) is not None


def _is_trainer_v2(environ: Environ) -> bool:
    return (
        "PET_NODE_RANK" in environ
        and "PET_MASTER_ADDR" in environ
        and "RANK" not in environ
        and "WORLD_SIZE" not in environ
    )


def _refuse_torchrun_only(environ: Environ, counted_as: str) -> None:
    """Refuse the layouts only torchrun can serve: several processes per pod, or elastic."""
    nproc = nproc_per_node(environ)
    if nproc != 1:
        raise RankError(
            f"PET_NPROC_PER_NODE={environ['PET_NPROC_PER_NODE']!r}: {counted_as} {nproc} "
            "processes per pod, but this process was started without torchrun, so each pod "
            "runs one process and the rendezvous would wait forever for the others",
            hint=TORCHRUN_HINT,
        )
    endpoint = environ.get("PET_RDZV_ENDPOINT", "")
    nnodes = environ.get("PET_NNODES", "")
    if endpoint or ":" in nnodes:
        raise RankError(
            f"elastic job (PET_RDZV_ENDPOINT={endpoint!r}, PET_NNODES={nnodes!r}): "
            "only torchrun can join an elastic rendezvous",
            hint=TORCHRUN_HINT,
        )


def _master(environ: Environ, hint: str) -> tuple[str, int]:
    # A MASTER_ADDR/MASTER_PORT exported by the user wins over the operator's PET_* copies.
    addr_var = first(environ, "MASTER_ADDR", "PET_MASTER_ADDR") or "MASTER_ADDR"
    port = master_port(environ, "MASTER_PORT", "PET_MASTER_PORT", hint=hint)
    return environ[addr_var].strip(), port


class PyTorchJobSource(RankSource):
    name = "pytorchjob"
    required = ("RANK", "WORLD_SIZE", "MASTER_ADDR|PET_MASTER_ADDR", "MASTER_PORT|PET_MASTER_PORT")
    variables = {
        "rank": "RANK (pod index)",
        "world_size": "WORLD_SIZE (pods x nprocPerNode)",
        "node_rank": "RANK (pod index)",
        "num_nodes": "PET_NNODES",
        "local_world_size": "PET_NPROC_PER_NODE",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT",
    }
    launch_hint = (
        "give the PyTorchJob a Master replica (replicas: 1): without one the operator sets "
        "no RANK, WORLD_SIZE or MASTER_ADDR; or " + TORCHRUN_HINT
    )

    def detect(self, environ: Environ) -> bool:
        return _under_operator(environ) and not _is_trainer_v2(environ)

    def resolve(self, environ: Environ) -> RankInfo:
        world = environ.get("WORLD_SIZE", "?")
        _refuse_torchrun_only(environ, f"the operator set WORLD_SIZE={world} counting")
        self.require(environ)
        rank = env_int(environ, "RANK", hint=self.launch_hint)
        world_size = env_int(environ, "WORLD_SIZE", minimum=1, hint=self.launch_hint)
        addr, port = _master(environ, self.launch_hint)
        return RankInfo(
            rank=rank,
            local_rank=0,
            world_size=world_size,
            local_world_size=1,
            node_rank=rank,
            num_nodes=env_int(environ, "PET_NNODES", minimum=1, default=world_size),
            master_addr=addr,
            master_port=port,
            source=self.name,
        )


class TrainerSource(RankSource):
    name = "trainer"
    required = ("PET_NNODES", "PET_NODE_RANK", "MASTER_ADDR|PET_MASTER_ADDR", "MASTER_PORT|PET_MASTER_PORT")
    variables = {
        "rank": "PET_NODE_RANK",
        "world_size": "PET_NNODES",
        "node_rank": "PET_NODE_RANK",
        "num_nodes": "PET_NNODES",
        "local_world_size": "PET_NPROC_PER_NODE",
        "master_addr": "PET_MASTER_ADDR",
        "master_port": "PET_MASTER_PORT",
    }
    launch_hint = "run it as a TrainJob with the torch runtime; " + TORCHRUN_HINT

    def detect(self, environ: Environ) -> bool:
        return _under_operator(environ) and _is_trainer_v2(environ)

    def resolve(self, environ: Environ) -> RankInfo:
        _refuse_torchrun_only(environ, "the TrainJob asks for")
        self.require(environ)
        num_nodes = env_int(environ, "PET_NNODES", minimum=1, hint=self.launch_hint)
        node_rank = env_int(environ, "PET_NODE_RANK", hint=self.launch_hint)
        addr, port = _master(environ, self.launch_hint)
        return RankInfo(
            rank=node_rank,
            local_rank=0,
            world_size=num_nodes,
            local_world_size=1,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=addr,
            master_port=port,
            source=self.name,
        )
