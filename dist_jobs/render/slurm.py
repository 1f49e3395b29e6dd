"""The typed context of the sbatch template (templates/sbatch.sh.j2)."""

from __future__ import annotations

from typing import Any

from dist_jobs.constants import REQUEUE_EXIT_CODE, REQUEUE_LIMIT_EXIT_CODE
from dist_jobs.render.common import header_lines, torchrun_tail
from dist_jobs.render.quoting import sbatch_value, slurm_filename
from dist_jobs.spec import JobSpec
from dist_jobs.spec.env import job_env
from dist_jobs.spec.slurm_time import format_time, parse_time

# Signal the batch shell receives `grace_seconds` before the time limit (B: = batch shell only);
# the script forwards the spec's signal to the step, so user scripts see what they asked for.
_BATCH_WARNING = "USR1"


def _time_limit(text: str | None) -> str | None:
    """The spec's limit in SLURM's canonical form (load_spec has checked that it parses)."""
    seconds = parse_time(text) if text else None
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
        "output": slurm_filename(spec.log_dir.rstrip("/") or ".") + "/" + pattern,
        "open-mode": "append",
        "requeue": True,
        "signal": f"B:{_BATCH_WARNING}@{spec.preemption.grace_seconds}",
        "mem": spec.memory,
        "time": _time_limit(spec.time),
        "chdir": spec.workdir,
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


def _step(spec: JobSpec) -> tuple[list[str], list[str]]:
    """(srun flags, program argv) of the one job step; shell-variable parts stay unquoted in the template."""
    srun = ["--kill-on-bad-exit=1", "--wait=60"]
    argv = spec.argv
    if spec.launcher == "torchrun":
        srun.append("--ntasks-per-node=1")
        argv = torchrun_tail(argv)
    prefix: list[str] = []
    slurm = spec.slurm
    if slurm.container == "pyxis" and spec.image:
        srun.append(f"--container-image={spec.image}")
        if slurm.container_mounts:
            srun.append("--container-mounts=" + ",".join(slurm.container_mounts))
    elif slurm.container == "apptainer" and spec.image:
        prefix = ["apptainer", "exec", "--nv"]
        if slurm.container_mounts:
            prefix += ["--bind", ",".join(slurm.container_mounts)]
        prefix.append(spec.image)
    return srun, prefix + argv if spec.launcher == "srun" else prefix


def slurm_context(spec: JobSpec) -> dict[str, Any]:
    srun_flags, program = _step(spec)
    return {
        "header": header_lines(spec, "Submit with: sbatch THIS_FILE  (or: dist-jobs submit --backend slurm job.yaml)"),
        "directives": sbatch_directives(spec),
        "env": list(job_env(spec, "slurm").items()),
        "setup": spec.setup,
        "launcher": spec.launcher,
        "srun_flags": srun_flags,
        "program": program,
        "torchrun_args": torchrun_tail(spec.argv) if spec.launcher == "torchrun" else [],
        "procs": spec.procs,
        "master_port": spec.master_port,
        "array": bool(spec.slurm.array),
        "forward_signal": spec.preemption.signal if spec.launcher == "srun" else "TERM",
        "warning_signal": _BATCH_WARNING,
        "requeue_code": REQUEUE_EXIT_CODE,
        "limit_code": REQUEUE_LIMIT_EXIT_CODE,
    }
