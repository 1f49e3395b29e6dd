"""How the training entrypoints log: rank 0 tells the story (steps, checkpoints, resumes), the
other ranks speak up only about problems. Both entrypoints use it: `python -m dist_jobs.train`
and TrainTask under submitit, whose tasks would otherwise configure no logging at all."""

from __future__ import annotations

import logging
import sys


def log_to_stderr(rank: int) -> None:
    """Configure the root logger for this rank, unless something already has (basicConfig's rule)."""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
