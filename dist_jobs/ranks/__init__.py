"""Which process am I? One answer (RankInfo) for every launcher the project supports.

`resolve()` asks the sources in a fixed order and takes the first that recognises the
environment:

1. `DIST_JOBS_ENV` (torchrun | slurm | pytorchjob | trainer | openmpi | single) forces one;
   its variables must then be present.
2. torchrun/torchelastic: it runs inside SLURM steps and PyTorchJob pods, and its own
   per-child variables are the truth there.
3. a SLURM task started by srun (not the batch script, not an salloc shell).
4. a Kubeflow PyTorchJob pod, then a Trainer v2 TrainJob node (one python per pod).
5. Open MPI / PMIx (mpirun).
6. a single process.

Stdlib only: resolve before importing torch, fail fast with a message and a hint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dist_jobs.errors import RankError
from dist_jobs.ranks.base import RankInfo, RankSource, list_missing
from dist_jobs.ranks.openmpi import OpenMPISource
from dist_jobs.ranks.pytorchjob import PyTorchJobSource, TrainerSource
from dist_jobs.ranks.single import SingleSource
from dist_jobs.ranks.slurm import SlurmSource
from dist_jobs.ranks.torchrun import TorchrunSource

OVERRIDE_VAR = "DIST_JOBS_ENV"

# Detection order; the names are also the accepted values of DIST_JOBS_ENV.
SOURCES: Mapping[str, RankSource] = {
    source.name: source
    for source in (
        TorchrunSource(),
        SlurmSource(),
        PyTorchJobSource(),
        TrainerSource(),
        OpenMPISource(),
        SingleSource(),
    )
}


def resolve(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank, world and rendezvous address (default: from os.environ)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    override = env.get(OVERRIDE_VAR, "").strip().lower()
    if override:
        return _resolve_override(override, env)
    for source in SOURCES.values():
        if source.detect(env):
            return source.resolve(env)
    raise AssertionError("the single-process source always detects")


def _resolve_override(name: str, env: Mapping[str, str]) -> RankInfo:
    source = SOURCES.get(name)
    if source is None:
        raise RankError(
            f"{OVERRIDE_VAR}={name!r} is not a known rank source",
            hint=f"use one of {', '.join(SOURCES)}, or unset {OVERRIDE_VAR} to detect it",
        )
    missing = source.missing(env)
    if missing:
        raise RankError(
            f"{OVERRIDE_VAR}={name} but {list_missing(missing)} in this process's environment",
            hint=f"unset {OVERRIDE_VAR} to detect the launcher, or {source.launch_hint}",
        )
    return source.resolve(env)


__all__ = ["RankInfo", "RankSource", "SOURCES", "resolve"]
