"""`python -m dist_jobs.train [flags]`: the training entrypoint every rendered job runs.

Exit codes: 0 done; dist_jobs.REQUEUE_EXIT_CODE (200) after a preemption checkpoint, or when a
peer vanished (PeerLost), to be requeued; 3 for an inconsistent launch (RankError); 2 for bad
flags; 1 for other failures. Errors of dist-jobs print their message and hint, without a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.errors import DistJobsError, SpecError
from dist_jobs.ranks import resolve
from dist_jobs.ranks.selfcheck import check
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.logsetup import log_to_stderr

BAD_FLAGS_EXIT_CODE = 2


def main(argv: list[str] | None = None) -> int:
    try:
        config = TrainConfig.from_argv(sys.argv[1:] if argv is None else argv)
    except SpecError as exc:
        flags = [dataclasses.replace(p, field="--" + p.field.replace("_", "-")) for p in exc.problems]
        print(f"error: {SpecError(flags, exc.source)}\n  hint: see python -m dist_jobs.train --help", file=sys.stderr)
        return BAD_FLAGS_EXIT_CODE
    try:
        rank = preflight()
        log_to_stderr(rank)
        from dist_jobs.train.loop import fit  # torch loads here: seconds

        fit(config)
    except DistJobsError as exc:
        preempted = exc.exit_code == REQUEUE_EXIT_CODE
        print(str(exc) if preempted else f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0  # any other exception is a bug: its traceback is worth having, and it is permanent


def preflight() -> int:
    """Resolve and self-check this rank before torch is imported: a bad launch fails at once.

    Returns the rank. fit() checks again with the GPU count, which needs torch.
    """
    info = resolve()
    check(info, allow_loopback=os.environ.get("DIST_JOBS_BACKEND", "").strip() == "local")
    # One line per rank: when a launch maps ranks wrongly, this is the first thing to read.
    print(
        f"dist-jobs: rank {info.rank}/{info.world_size} node {info.node_rank}/{info.num_nodes} "
        f"local {info.local_rank}/{info.local_world_size} master {info.master_addr}:"
        f"{info.master_port} ({_launched_by(info.source)}, host {socket.gethostname()})",
        file=sys.stderr,
        flush=True,
    )
    return info.rank


def _launched_by(source: str) -> str:
    """Who started this rank, for the banner: the rank source, except under the local backend,
    which plays srun (SLURM's variables, made-up ids) on a machine without SLURM."""
    if os.environ.get("DIST_JOBS_BACKEND", "").strip() == "local":
        return f"local backend, {source} variables"
    return source


if __name__ == "__main__":
    sys.exit(main())
