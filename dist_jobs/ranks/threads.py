"""How many intra-op CPU threads one process should use by default.

Measured on 2 cores: two processes with torch's default of one thread per core (2 x 2 threads)
ran at 0.09-0.14x the steps/s of one thread each. A user's OMP_NUM_THREADS always wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Set by a launcher that puts several "nodes" on one host (the local backend): how many
# processes share this host's CPUs, whatever the node layout says.
SHARING_VAR = "DIST_JOBS_PROCS_ON_HOST"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which SLURM and cgroups narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_threads(environ: Mapping[str, str], local_world_size: int, cpus: int) -> int:
    """This process's share of `cpus`.

    An srun task with `--cpus-per-task` owns its CPUs (SLURM_CPUS_PER_TASK). Otherwise every
    process of the node sees the same CPUs and gets an equal share.
    """
    sharing = environ.get(SHARING_VAR, "").strip()
    if sharing.isdigit() and int(sharing) > 0:
        return max(1, cpus // int(sharing))
    per_task = environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if per_task.isdigit() and int(per_task) > 0 and "SLURM_PROCID" in environ:
        return max(1, min(int(per_task), cpus))
    return max(1, cpus // max(1, local_world_size))
