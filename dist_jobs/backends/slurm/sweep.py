"""A sweep on SLURM: ONE job array (`--array=0-(n-1)%K`), each task a whole multi-node job
(render/slurm_array.py), every trial running from one snapshot of the code unless the spec says not
(SlurmBackend.snapshot)."""

from __future__ import annotations

from typing import Any

import msgspec

from dist_jobs.backends.base import PreparedSweep
from dist_jobs.render.slurm_array import head_overrides, sweep_script
from dist_jobs.spec import JobSpec
from dist_jobs.spec.load import load_spec


def prepare_array(
    name: str, params: list[dict[str, Any]], specs: list[JobSpec], max_parallel: int | None
) -> PreparedSweep:
    """The array's own spec (the head) and its one script, which runs trial i as task i."""
    overrides = head_overrides(name, specs[0].checkpoint_dir, len(specs), max_parallel)
    head = load_spec(data=msgspec.to_builtins(specs[0]), overrides=overrides, backend="slurm")
    script = sweep_script(head, specs)
    return PreparedSweep(name, "slurm", params, specs, [(f"{head.run_id}.sbatch", script)], head, max_parallel, script)
