"""The typed context of the sbatch template (templates/sbatch.sh.j2)."""

from __future__ import annotations

from typing import Any

from dist_jobs.constants import LOCK_LOST_EXIT_CODE, REQUEUE_EXIT_CODE, REQUEUE_LIMIT_EXIT_CODE, TORCHRUN_MODULE
from dist_jobs.render.common import header_lines, step_argv, step_signal
from dist_jobs.render.quoting import sbatch_value, sh, sh_argv, slurm_filename
from dist_jobs.spec import JobSpec
from dist_jobs.spec.env import job_env
from dist_jobs.spec.paths import expand_home
from dist_jobs.spec.slurm_time import format_time, parse_time

# Signal the batch shell receives `grace_seconds` before the time limit (B: = batch shell only);
# the script forwards the spec's signal to the step, so user scripts see what they asked for.
_BATCH_WARNING = "USR1"


def _time_limit(text: str | int | None) -> str | None:
    """The spec's limit in SLURM's canonical form (load_spec has checked that it parses)."""
    seconds = parse_time(text) if text is not None and text != "" else None
    return None if seconds is None else format_time(seconds)


def sbatch_directives(spec: JobSpec) -> list[str]:
    """`--flag=value` strings, values shell-quoted as sbatch's #SBATCH parser understands, sorted."""
    per_task = spec.procs if spec.launcher == "srun" else 1
    cpus = spec.cpus_per_task if spec.launcher == "srun" else spec.cpus_per_task * spec.procs
    slurm = spec.slurm
    pattern = "%x-%A_%a.out" if slurm.array else "%x-%j.out"
    flags: dict[str, Any] = {
        "job-name": spec.run_id,
        "nodes": spec.nodes,
        "ntasks-per-node": per_task,
        "cpus-per-task": cpus,
        "output": slurm_filename(expand_home(spec.log_dir).rstrip("/") or ".") + "/" + pattern,
        "open-mode": "append",
        "requeue": True,
        "signal": f"B:{_BATCH_WARNING}@{spec.preemption.grace_seconds}",
        "mem": spec.memory,
        "time": _time_limit(spec.time),
        "chdir": expand_home(spec.workdir) if spec.workdir else None,
        "partition": slurm.partition,
        "account": slurm.account,
        "qos": slurm.qos,
        "constraint": slurm.constraint,
        "exclusive": slurm.exclusive or None,
        "nodelist": slurm.nodelist,
        "exclude": slurm.exclude,
        "reservation": slurm.reservation,
        "dependency": slurm.dependency,
        "mail-user": slurm.mail_user,
        "mail-type": slurm.mail_type,
        "array": slurm.array,
    }
    if spec.gpus_per_node:
        key, value = (
            ("gpus-per-node", spec.gpus_per_node)
            if slurm.gpus_flag == "gpus-per-node"
            else ("gres", f"gpu:{spec.gpus_per_node}")
        )
        flags[key] = value
    lines = [f"--{k}" if v is True else f"--{k}={sbatch_value(v)}" for k, v in flags.items() if v is not None]
    return sorted(lines + list(slurm.extra_sbatch))


def _container(spec: JobSpec) -> tuple[list[str], list[str]]:
    """(srun flags, argv prefix) that run the step's program in `image`, if a container is asked for."""
    slurm = spec.slurm
    if slurm.container == "pyxis" and spec.image:
        mounts = ["--container-mounts=" + ",".join(slurm.container_mounts)] if slurm.container_mounts else []
        return [f"--container-image={spec.image}", *mounts], []
    if slurm.container == "apptainer" and spec.image:
        binds = ["--bind", ",".join(slurm.container_mounts)] if slurm.container_mounts else []
        return [], ["apptainer", "exec", "--nv", *binds, spec.image]
    return [], []


def _pythons(spec: JobSpec) -> tuple[str, str]:
    """Shell words for the batch shell's python and the tasks' python.

    Without `python:` the batch shell takes DIST_JOBS_PYTHON, which `dist-jobs submit` sets to its
    own interpreter: a job submitted from a shell without the venv active still finds dist-jobs.
    Inside a container the host's interpreter means nothing: the image's python3 runs the tasks.
    """
    batch = sh(spec.python) if spec.python else '"${DIST_JOBS_PYTHON:-python3}"'
    in_container = any(_container(spec))
    return batch, (sh(spec.python or "python3") if in_container else '"$DJ_PY"')


def slurm_context(spec: JobSpec) -> dict[str, Any]:
    container_flags, prefix = _container(spec)
    srun_flags = [
        "--kill-on-bad-exit=1",
        "--wait=60",
        *(["--ntasks-per-node=1"] if spec.launcher == "torchrun" else []),
    ]
    python, task_python = _pythons(spec)
    return {
        "header": header_lines(spec, "Submit with: sbatch THIS_FILE  (or: dist-jobs submit --backend slurm job.yaml)"),
        "directives": sbatch_directives(spec),
        "env": list(job_env(spec, "slurm").items()),
        "setup": spec.setup,
        "launcher": spec.launcher,
        "torchrun_module": TORCHRUN_MODULE,
        "srun_flags": srun_flags + container_flags,
        "prefix": prefix,
        "python": python,
        "task_python": task_python,
        "check_python": not (container_flags or prefix),
        "program_words": sh_argv(step_argv(spec)),
        "trials": [],
        "procs": spec.procs,
        # Worth a step of its own where a node can differ from the batch host: another node, GPUs.
        "node_check": spec.nodes > 1 or bool(spec.gpus_per_node),
        "gpus": spec.gpus_per_node or 0,
        "master_port": spec.master_port,
        "array": bool(spec.slurm.array),
        "forward_signal": step_signal(spec),
        "warning_signal": _BATCH_WARNING,
        "requeue_code": REQUEUE_EXIT_CODE,
        "limit_code": REQUEUE_LIMIT_EXIT_CODE,
        "lock_lost_code": LOCK_LOST_EXIT_CODE,
    }
