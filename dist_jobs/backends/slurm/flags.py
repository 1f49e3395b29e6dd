"""The `slurm:` section of the spec as command-line flags (SlurmBackend.spec_flags)."""

from __future__ import annotations

from dist_jobs.spec.flags import SpecFlag

SPEC_FLAGS = (
    SpecFlag("--partition", "slurm.partition", "SLURM partition"),
    SpecFlag("--account", "slurm.account", "SLURM account"),
    SpecFlag("--qos", "slurm.qos", "SLURM QOS"),
    SpecFlag("--constraint", "slurm.constraint", "SLURM node features"),
    SpecFlag("--exclusive", "slurm.exclusive", "SLURM exclusive node access", "true"),
    SpecFlag("--nodelist", "slurm.nodelist", "SLURM nodes to use"),
    SpecFlag("--exclude", "slurm.exclude", "SLURM nodes to avoid"),
    SpecFlag("--reservation", "slurm.reservation", "SLURM reservation"),
    SpecFlag("--dependency", "slurm.dependency", "SLURM dependency, e.g. afterok:123"),
    SpecFlag("--array", "slurm.array", "SLURM array, e.g. 0-9%2 (at most 2 at once)"),
    SpecFlag("--mail-user", "slurm.mail_user", "SLURM mail address"),
    SpecFlag("--mail-type", "slurm.mail_type", "SLURM mail events, e.g. END,FAIL"),
    SpecFlag("--sbatch", "slurm.extra_sbatch", "raw extra #SBATCH flag (repeatable)", "append"),
    SpecFlag("--container", "slurm.container", "SLURM container runtime: none, pyxis or apptainer"),
)
