"""SLURM: sbatch, squeue, sacct and scancel through an injectable command runner.

By concept: `backend` (the Backend: status, list, cancel, logs, run directory), `submit` (the job
directory and `sbatch`), `sbatch` (what sbatch says), `output` (what squeue and sacct print),
`meta` (job.json, array tasks), `limits` (a request too big, in the cluster's numbers),
`faults` (nodes that stopped answering), `batchlog` (what the batch script logged), `logs`
(per-rank log files).
"""

from dist_jobs.backends.slurm.backend import SlurmBackend

BACKEND = SlurmBackend

__all__ = ["BACKEND", "SlurmBackend"]
