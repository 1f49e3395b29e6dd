"""submitit for notebooks: an executor built from the same job spec (the task is dist_jobs.train.task).

from dist_jobs.spec import load_spec
from dist_jobs.backends.submitit_executor import make_executor
from dist_jobs.train.task import TrainTask
spec = load_spec("job.yaml")
job = make_executor(spec, "submitit-logs").submit(TrainTask(spec))
job.task(0).result()   # rank 0's final metrics (job.result() for a one-task job; job.results() for all)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dist_jobs.errors import UsageError
from dist_jobs.render.quoting import sh
from dist_jobs.spec import JobSpec
from dist_jobs.spec.slurm_time import parse_time


def executor_parameters(spec: JobSpec, cluster: str) -> dict[str, Any]:
    """AutoExecutor parameters mapped from the spec (pure, so tests can check the mapping)."""
    params: dict[str, Any] = {
        "name": spec.run_id,
        "nodes": spec.nodes,
        "tasks_per_node": spec.procs,
        "cpus_per_task": spec.cpus_per_task,
        "gpus_per_node": spec.gpus_per_node,
        "timeout_min": max(1, (parse_time(spec.time) or 3600) // 60) if spec.time else 60,
    }
    if spec.memory:
        units = {"K": 1 / 1024 / 1024, "M": 1 / 1024, "G": 1, "T": 1024}
        params["mem_gb"] = (
            max(1, int(int(spec.memory[:-1]) * units[spec.memory[-1]]))
            if spec.memory[-1] in units
            else max(1, int(spec.memory) // 1024)
        )
    if cluster != "slurm":
        return params
    slurm = spec.slurm
    extra = {
        k: v
        for k, v in {
            "account": slurm.account,
            "qos": slurm.qos,
            "constraint": slurm.constraint,
            "reservation": slurm.reservation,
            "exclude": slurm.exclude,
            "nodelist": slurm.nodelist,
            "requeue": True,
        }.items()
        if v
    }
    # spec.env is exported before the setup lines, as in the sbatch script: TrainTask sets it
    # again in the process, but only the batch shell can set what Python reads at start-up
    # (PYTHONPATH, OMP_NUM_THREADS, ...).
    exports = [f"export {name}={sh(value)}" for name, value in spec.env.items()]
    params.update(
        {
            "slurm_partition": slurm.partition,
            "slurm_setup": exports + list(spec.setup),
            "slurm_signal_delay_s": spec.preemption.grace_seconds,
            "slurm_additional_parameters": extra,
        }
    )
    if slurm.exclusive:
        params["slurm_exclusive"] = True
    return {k: v for k, v in params.items() if v is not None}


def make_executor(spec: JobSpec, folder: str | Path, cluster: str | None = None) -> Any:
    """A submitit executor: SLURM where sbatch exists, else the local executor (one node)."""
    import submitit  # optional ([submitit]), and the render side imports none of it (test_imports)

    chosen = cluster or ("slurm" if shutil.which("sbatch") else "local")
    if chosen == "local" and spec.nodes > 1:
        raise UsageError(
            f"submitit's local executor runs one node, the spec asks for {spec.nodes}",
            "use nodes: 1 here, or `dist-jobs run --backend local` for several local nodes",
        )
    # The requeue budget is an argument of the executor itself, not a job parameter.
    options = {"slurm_max_num_timeout": spec.preemption.max_requeues} if chosen == "slurm" else {}
    executor = submitit.AutoExecutor(folder=str(folder), cluster=chosen, **options)
    executor.update_parameters(**executor_parameters(spec, chosen))
    return executor
