"""Job-spec flags shared by `render`, `submit` and `run`: each maps to one dotted spec path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from dist_jobs.errors import MISSING, Problem, SpecError


@dataclass(frozen=True)
class Flag:
    flag: str
    path: str
    help: str
    kind: str = "value"  # value | true | append | env


FLAGS: tuple[Flag, ...] = (
    Flag("--name", "name", "job name"),
    Flag("--nodes", "nodes", "number of nodes"),
    Flag("--gpus", "gpus_per_node", "GPUs per node"),
    Flag("--procs-per-node", "procs_per_node", "processes per node (default: --gpus; required without GPUs)"),
    Flag("--cpus-per-task", "cpus_per_task", "CPUs per process"),
    Flag("--mem", "memory", "memory per node, e.g. 64G"),
    Flag("--time", "time", "time limit: minutes, HH:MM:SS or D-HH:MM:SS"),
    Flag("--launcher", "launcher", "srun (one task per process) or torchrun (one task per node)"),
    Flag("--workdir", "workdir", "working directory of the job"),
    Flag("--snapshot", "snapshot", "run a copy of the code as it is now, on every attempt", "true"),
    Flag("--checkpoint-dir", "checkpoint_dir", "shared checkpoint root"),
    Flag("--log-dir", "log_dir", "log folder"),
    Flag("--master-port", "master_port", "fixed master port (default: derived from the job id)"),
    Flag("--image", "image", "container image"),
    Flag("--env", "env", "KEY=VALUE environment variable (repeatable)", "env"),
    Flag("--setup", "setup", "shell line run before launch (repeatable)", "append"),
    Flag("--partition", "slurm.partition", "SLURM partition"),
    Flag("--account", "slurm.account", "SLURM account"),
    Flag("--qos", "slurm.qos", "SLURM QOS"),
    Flag("--constraint", "slurm.constraint", "SLURM node features"),
    Flag("--exclusive", "slurm.exclusive", "SLURM exclusive node access", "true"),
    Flag("--nodelist", "slurm.nodelist", "SLURM nodes to use"),
    Flag("--exclude", "slurm.exclude", "SLURM nodes to avoid"),
    Flag("--reservation", "slurm.reservation", "SLURM reservation"),
    Flag("--dependency", "slurm.dependency", "SLURM dependency, e.g. afterok:123"),
    Flag("--array", "slurm.array", "SLURM array, e.g. 0-9%%2 (at most 2 at once)"),
    Flag("--mail-user", "slurm.mail_user", "SLURM mail address"),
    Flag("--mail-type", "slurm.mail_type", "SLURM mail events, e.g. END,FAIL"),
    Flag("--sbatch", "slurm.extra_sbatch", "raw extra #SBATCH flag (repeatable)", "append"),
    Flag("--container", "slurm.container", "SLURM container runtime: none, pyxis or apptainer"),
    Flag("--namespace", "k8s.namespace", "Kubernetes namespace"),
    Flag("--pvc", "k8s.pvc", "Kubernetes PVC holding the checkpoint directory"),
    Flag("--api", "k8s.api", "Kubernetes API: pytorchjob or trainjob"),
    Flag("--nccl-socket-ifname", "nccl.socket_ifname", "NCCL_SOCKET_IFNAME"),
    Flag("--nccl-ib-disable", "nccl.ib_disable", "set NCCL_IB_DISABLE=1", "true"),
    Flag("--nccl-debug", "nccl.debug", "NCCL_DEBUG level"),
    Flag("--signal", "preemption.signal", "preemption signal: USR1, USR2 or TERM"),
    Flag("--grace", "preemption.grace_seconds", "seconds of warning before the time limit"),
    Flag("--max-requeues", "preemption.max_requeues", "requeues allowed after preemption"),
    Flag("--max-restarts", "preemption.max_restarts", "restarts in place after a fault, per allocation"),
    Flag("--set", "", "any spec field: PATH=VALUE, e.g. --set train.epochs=5 (repeatable)", "set"),
)


# The help's sections, by the spec path's first part: `dist-jobs submit --help` reads by topic.
GROUPS = {
    "slurm": "SLURM flags",
    "k8s": "Kubernetes flags",
    "nccl": "training flags (NCCL, any spec field)",
    "": "training flags (NCCL, any spec field)",  # --set: train.* and every other field
    "preemption": "preemption flags",
}


def add_spec_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="job.yaml (optional: flags alone make a spec)")
    parser.add_argument(
        "--profile",
        help="a profile of ~/.config/dist-jobs/config.yaml (default: $DIST_JOBS_PROFILE, else the file's `default:`)",
    )
    groups: dict[str, Any] = {}
    for f in FLAGS:
        title = GROUPS.get(
            f.path.split(".")[0] if "." in f.path or not f.path else "job", "job flags (override job.yaml)"
        )
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        dest = "flag_" + f.flag.lstrip("-").replace("-", "_")
        if f.kind == "true":
            group.add_argument(f.flag, dest=dest, action="store_const", const=True, help=f.help)
        elif f.kind in ("append", "env", "set"):
            group.add_argument(f.flag, dest=dest, action="append", metavar="VALUE", help=f.help)
        else:
            group.add_argument(f.flag, dest=dest, metavar="VALUE", help=f.help)


def overrides_from(
    args: argparse.Namespace, command: list[str] | None, deferred: list[Problem] | None = None
) -> dict[str, Any]:
    """Dotted-path overrides from the parsed flags; bad KEY=VALUE forms and unknown paths are
    collected, then raised, or added to `deferred` (to be raised with the spec's own problems)."""
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for f in FLAGS:
        value = getattr(args, "flag_" + f.flag.lstrip("-").replace("-", "_"), None)
        if value is None:
            continue
        if f.kind in ("env", "set"):
            for item in value:
                key, sep, val = item.partition("=")
                if not sep or not key:
                    problems.append(Problem(f.flag, item, "must look like KEY=VALUE", f"e.g. {f.flag} A=1"))
                elif f.kind == "env":
                    out[f"env.{key}"] = val
                else:
                    problems += _set(out, key, val, f.flag)
        else:
            out[f.path] = value
    if command:
        out["command"] = command
    if problems and deferred is None:
        raise SpecError(problems, "command line")
    if deferred is not None:
        deferred += problems
    return out


def _set(out: dict[str, Any], key: str, val: str, flag: str) -> list[Problem]:
    """One `--set PATH=VALUE` into `out`; its problems. Spaces around PATH and `=` are dropped
    (`--set 'train.lr = 0.1'`), and an unknown PATH is named as the command line gave it."""
    from dist_jobs.spec.model import JobSpec  # the spec verbs' alone, as _scalar's yaml
    from dist_jobs.spec.validate import unknown_path

    key, val = key.strip(), val.lstrip()
    given = f"{flag} {key}={val}"
    wrong = unknown_path(JobSpec, key)
    if wrong is not None:
        part, meant, known = wrong
        fix = (
            f"did you mean {flag} {meant}{key[len(part) :]}={val}?" if meant else f"known keys here: {', '.join(known)}"
        )
        return [Problem(given, MISSING, f"`{part}` is not a spec field", fix)]
    try:
        out[key] = _scalar(val, f"{flag} {key}")
    except SpecError as exc:
        return exc.problems
    return []


def _scalar(text: str, flag: str) -> Any:
    # `--set train.epochs=5` should give an int and `--set slurm.exclusive=true` a bool, as in YAML;
    # text that is not YAML stays text, but a value too big, deep or alias-expanding is refused.
    # here: the query verbs (status, list, ...) load no yaml (tests/unit/test_imports.py)
    import yaml

    from dist_jobs.spec.yaml_input import parse_bounded

    try:
        return parse_bounded(text, flag) if text else ""
    except yaml.YAMLError:
        return text


def trainer_flag_fixes(argv: list[str]) -> list[str]:
    """`--set train.X=V` for each of the trainer's own flags in `argv` (`--shm-allreduce`,
    `--no-progress`, `--model gpt`, `--lr=0.1`), which dist-jobs itself does not take."""
    from msgspec import structs  # this error's alone

    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.spec.validate import plain_type

    fields = {f.name: plain_type(f.type) is bool for f in structs.fields(TrainConfig)}
    own = {f.flag for f in FLAGS}
    fixes = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        name = flag.removeprefix("--").replace("-", "_")
        negated = name.startswith("no_") and fields.get(name[3:]) is True
        if not flag.startswith("--") or flag in own or not (name in fields or negated):
            continue
        if negated or fields.get(name) is True:
            fixes.append(f"--set train.{name.removeprefix('no_') if negated else name}={str(not negated).lower()}")
        elif eq or (i + 1 < len(argv) and not argv[i + 1].startswith("-")):
            fixes.append(f"--set train.{name}={value if eq else argv[i + 1]}")
        else:
            fixes.append(f"--set train.{name}=VALUE")
    return fixes
