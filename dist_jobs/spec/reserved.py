"""Environment variable names a job spec's `env:` may not set, in one table with the reason and the fix.

Four owners. bash: the batch script is bash, and bash evaluates an assignment to some of its
own variables as arithmetic (`RANDOM=PWD[$(cmd)]` runs cmd) or keeps them read-only or
recomputed, so the value would run code or never reach the job; it acts on every other `BASH_*`
(BASH_ENV runs a file in each bash the job starts) and on PWD, PATH and EXECIGNORE, which the
script's own lines rely on (the user's exports come first). The scheduler: the script reads
SLURM_JOB_ID, SLURM_JOB_NODELIST, ... to name, reach and requeue its own job, and srun reads
SLURM_* as options. dist-jobs: `job_env` sets these for every backend and the launch reads them
back. torch: every launch mode sets the env:// variables per process. `DIST_JOBS_ENV` and
`DIST_JOBS_RDZV_TIMEOUT` stay user knobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from dist_jobs.errors import Problem

# bash 5.x: assignments evaluated as arithmetic (code runs) or ignored, read-only or recomputed
# (the value never reaches the job). tests/unit/spec/test_reserved.py checks this against real bash.
BASH_OWNED = frozenset(
    {
        "_",
        "BASHOPTS",
        "BASHPID",
        "BASH_ALIASES",
        "BASH_ARGC",
        "BASH_ARGV",
        "BASH_CMDS",
        "BASH_COMMAND",
        "BASH_LINENO",
        "BASH_MONOSECONDS",
        "BASH_SOURCE",
        "BASH_SUBSHELL",
        "BASH_TRAPSIG",
        "BASH_VERSINFO",
        "DIRSTACK",
        "EPOCHREALTIME",
        "EPOCHSECONDS",
        "EUID",
        "FUNCNAME",
        "GROUPS",
        "HISTCMD",
        "LINENO",
        "OPTIND",
        "PIPESTATUS",
        "PPID",
        "RANDOM",
        "SECONDS",
        "SHELLOPTS",
        "SHLVL",
        "SRANDOM",
        "UID",
    }
)
# What `dist_jobs.spec.env.job_env` sets (tests/unit/spec/test_reserved.py keeps the two in step).
DIST_JOBS_OWNED = frozenset(
    {
        "DIST_JOBS_BACKEND",
        "DIST_JOBS_RUN",
        "DIST_JOBS_CHECKPOINT_DIR",
        "DIST_JOBS_LOG_DIR",
        "DIST_JOBS_NNODES",
        "DIST_JOBS_NPROC_PER_NODE",
        "DIST_JOBS_MAX_REQUEUES",
        "DIST_JOBS_MAX_RESTARTS",
        "DIST_JOBS_COLLECTIVE_TIMEOUT",
    }
)
TORCH_OWNED = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR"}
)
# What the batch script's own lines read, and why setting it breaks them (tests/unit/spec/test_reserved.py
# runs the rendered script with each).
SCRIPT_READ = {
    "PWD": (
        "is the batch script's working directory: the script makes relative checkpoint and log folders "
        "absolute with $PWD, so the run directory would move away from the one job.json and status name",
        "set `workdir` in the job spec instead",
    ),
    "PATH": (
        "is where the batch script finds mkdir, srun, scontrol and python before the job starts: one "
        "without them stops the job with 'command not found'",
        "extend it in a `setup:` line (export PATH=/opt/bin:$PATH), or name the interpreter with `python:`",
    ),
    "EXECIGNORE": (
        "makes bash skip matching programs on PATH: the batch script's own mkdir, srun or python "
        "would be 'command not found'",
        "drop it; a shell of your own can set it in its first line",
    ),
}
OWNED_PREFIXES = {
    "BASH_": (
        "is a variable bash acts on or sets (BASH_ENV runs a file in every bash the job starts, "
        "BASH_XTRACEFD and BASH_ARGV0 redirect tracing and rename the script, BASH_COMPAT changes the "
        "shell's rules): the batch script is bash",
        "rename the variable (e.g. MY_{name})",
    ),
    "SLURM_": (
        "is the scheduler's: the batch script reads SLURM_JOB_ID, SLURM_JOB_NODELIST, ... to name, reach "
        "and requeue its own job (a value of yours would requeue another job), and srun reads SLURM_* "
        "as its options",
        "use the job spec's fields (nodes, slurm.*, slurm.extra_sbatch) for the scheduler, or rename a "
        "variable of your own (e.g. MY_{name})",
    ),
}
_SPEC_FIELD = {
    "DIST_JOBS_RUN": "name (or train.run_name)",
    "DIST_JOBS_CHECKPOINT_DIR": "checkpoint_dir",
    "DIST_JOBS_LOG_DIR": "log_dir",
    "DIST_JOBS_NNODES": "nodes",
    "DIST_JOBS_NPROC_PER_NODE": "procs_per_node",
    "DIST_JOBS_MAX_REQUEUES": "preemption.max_requeues",
    "DIST_JOBS_MAX_RESTARTS": "preemption.max_restarts",
    "DIST_JOBS_COLLECTIVE_TIMEOUT": "train.collective_timeout",
    "MASTER_PORT": "master_port",
}


def reserved(name: str) -> tuple[str, str] | None:
    """(why `name` cannot be set through `env:`, the fix), or None when it can."""
    if name in BASH_OWNED:
        return (
            "is a variable bash itself owns: bash evaluates, ignores or recomputes an assignment to it, "
            "so the value could run code or would never reach the job",
            "rename the variable (e.g. MY_" + name.lstrip("_") + ")",
        )
    if name in SCRIPT_READ:
        return SCRIPT_READ[name]
    for prefix, (why, fix) in OWNED_PREFIXES.items():
        if name.startswith(prefix):
            return why, fix.format(name=name.removeprefix(prefix))
    field = _SPEC_FIELD.get(name)
    if name in DIST_JOBS_OWNED or name == "MASTER_PORT":
        fix = f"set `{field}` in the job spec instead" if field else "drop it: dist-jobs sets it from the backend"
        return "is set by dist-jobs for every process of the job", fix
    if name in TORCH_OWNED:
        return (
            "is set per process by the launch (torch's env:// variables), so one value for all would be wrong",
            "drop it: srun, torchrun or the operator set it for each rank",
        )
    return None


def env_problems(env: Mapping[str, str]) -> list[Problem]:
    """A problem for each reserved name in a spec's `env:`."""
    problems = []
    for name in env:
        found = reserved(name)
        if found is not None:
            problems.append(Problem(f"env.{name} (the key)", name, *found))
    return problems
