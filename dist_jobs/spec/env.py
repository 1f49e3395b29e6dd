"""The job's environment variables, one source for every backend (sbatch, PyTorchJob/TrainJob,
local processes, submitit). It lives in the spec layer because the runtime side (the submitit
task, the launcher) needs it as much as the renderers do."""

from __future__ import annotations

from dist_jobs.spec.model import JobSpec
from dist_jobs.spec.paths import expand_home


def job_env(spec: JobSpec, backend: str, checkpoint_dir: str | None = None) -> dict[str, str]:
    """The job's environment on every backend: dist-jobs' own variables, the NCCL knobs, then the
    user's `env`, which wins. `checkpoint_dir` is the backend's view of the shared root (under the
    PVC mount, absolute on this host); the batch script alone reads the log folder, it and the pod
    entrypoint read the requeue cap. `~` in the folders is expanded here, on the submitting host,
    as job.json and status have it (dist_jobs.spec.paths)."""
    nccl = spec.nccl
    in_script = backend == "slurm"
    capped = backend in ("slurm", "k8s")  # the batch script and the pod entrypoint count restarts
    # torchrun on SLURM (one log file per node) and in a pod (one log per pod): each worker line
    # carries its global rank, so `dist-jobs logs --rank R` finds rank R's lines there.
    torchrun_logs = (in_script and spec.launcher == "torchrun") or (backend == "k8s" and spec.k8s.launch == "torchrun")
    pairs = [
        ("DIST_JOBS_BACKEND", backend),
        ("DIST_JOBS_RUN", spec.run_id),
        ("DIST_JOBS_CHECKPOINT_DIR", expand_home(spec.checkpoint_dir) if checkpoint_dir is None else checkpoint_dir),
        ("DIST_JOBS_LOG_DIR", expand_home(spec.log_dir) if in_script else None),
        ("DIST_JOBS_NNODES", str(spec.nodes)),
        ("DIST_JOBS_NPROC_PER_NODE", str(spec.procs)),
        ("DIST_JOBS_MAX_REQUEUES", str(spec.preemption.max_requeues) if capped else None),
        # A pod's recreations on one node before the node is blamed (dist_jobs.rundir.pod_end).
        ("DIST_JOBS_MAX_RESTARTS", str(spec.preemption.max_restarts) if backend in ("slurm", "local", "k8s") else None),
        ("NCCL_SOCKET_IFNAME", nccl.socket_ifname),
        ("NCCL_IB_DISABLE", None if nccl.ib_disable is None else str(int(nccl.ib_disable))),
        ("NCCL_DEBUG", nccl.debug),
        # A collective that outlives its timeout (train.collective_timeout) becomes an error that
        # ends the process, instead of a hang; torch reads this name since 2.2 (warning on the
        # legacy NCCL_ASYNC_ERROR_HANDLING, so that one is left out).
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # Every collective's limit once the ranks have met (the trainer's init_process_group):
        # by default twice the hang watchdog's floor, so the watchdog fires first.
        ("DIST_JOBS_COLLECTIVE_TIMEOUT", collective_timeout(spec)),
        # A pod's processes see every core of its node (a CPU request is a share of the node, not a
        # cpuset), and torch starts a thread per core in each: each gets the CPUs it asked for. On
        # SLURM and locally the per-task launcher does the same (dist_jobs.ranks.threads).
        ("OMP_NUM_THREADS", str(spec.cpus_per_task) if backend == "k8s" else None),
        # torchrun reads PET_* as its flags.
        *((("PET_TEE", "3"), ("PET_LOG_LINE_PREFIX_TEMPLATE", "[rank ${rank}] ")) if torchrun_logs else ()),
    ]
    return {**{k: v for k, v in pairs if v is not None}, **spec.env}


def collective_timeout(spec: JobSpec) -> str | None:
    """train.collective_timeout, else 2 x train.hang_min_seconds (None with the watchdog off)."""
    train = spec.train
    if train.collective_timeout is not None:
        return f"{train.collective_timeout:g}"
    return f"{2 * train.hang_min_seconds:g}" if train.hang_watchdog else None
