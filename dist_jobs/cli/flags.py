"""Job-spec flags shared by `render`, `submit`, `run`, `sweep` and `config`: each sets one
dotted spec path. The job's are declared here, each backend's by its class (Backend.spec_flags)."""

from __future__ import annotations

import argparse
from typing import Any

from dist_jobs import api
from dist_jobs.errors import MISSING, Problem, SpecError
from dist_jobs.spec.flags import SpecFlag

JOB = "job flags (override job.yaml)"
TRAINING = "training flags (NCCL, any spec field)"
PREEMPTION = "preemption flags"

# The job's own flags, first in the help; then each backend's, for its spec section
# (Backend.spec_flags); then the training and preemption flags.
JOB_FLAGS = (
    SpecFlag("--name", "name", "job name"),
    SpecFlag("--nodes", "nodes", "number of nodes"),
    SpecFlag("--gpus", "gpus_per_node", "GPUs per node"),
    SpecFlag("--procs-per-node", "procs_per_node", "processes per node (default: --gpus; required without GPUs)"),
    SpecFlag("--cpus-per-task", "cpus_per_task", "CPUs per process"),
    SpecFlag("--mem", "memory", "memory per node, e.g. 64G"),
    SpecFlag("--time", "time", "time limit: minutes, HH:MM:SS or D-HH:MM:SS"),
    SpecFlag("--launcher", "launcher", "srun (one task per process) or torchrun (one task per node)"),
    SpecFlag("--workdir", "workdir", "working directory of the job"),
    SpecFlag("--snapshot", "snapshot", "run a copy of the code as it is now, on every attempt", "true"),
    SpecFlag("--checkpoint-dir", "checkpoint_dir", "shared checkpoint root"),
    SpecFlag("--log-dir", "log_dir", "log folder"),
    SpecFlag("--master-port", "master_port", "fixed master port (default: derived from the job id)"),
    SpecFlag("--image", "image", "container image"),
    SpecFlag("--env", "env", "KEY=VALUE environment variable (repeatable)", "env"),
    SpecFlag("--setup", "setup", "shell line run before launch (repeatable)", "append"),
)
TRAINING_FLAGS = (
    SpecFlag("--nccl-socket-ifname", "nccl.socket_ifname", "NCCL_SOCKET_IFNAME"),
    SpecFlag("--nccl-ib-disable", "nccl.ib_disable", "set NCCL_IB_DISABLE=1", "true"),
    SpecFlag("--nccl-debug", "nccl.debug", "NCCL_DEBUG level"),
)
PREEMPTION_FLAGS = (
    SpecFlag("--signal", "preemption.signal", "preemption signal: USR1, USR2 or TERM"),
    SpecFlag("--grace", "preemption.grace_seconds", "seconds of warning before the time limit"),
    SpecFlag("--max-requeues", "preemption.max_requeues", "requeues allowed after preemption"),
    SpecFlag("--max-restarts", "preemption.max_restarts", "restarts in place after a fault, per allocation"),
)
# In the training section, as the trainer's own fields are given with it; last in the usage line.
SET = SpecFlag("--set", "", "any spec field: PATH=VALUE, e.g. --set train.epochs=5 (repeatable)", "set")


def sectioned() -> list[tuple[str, SpecFlag]]:
    """Every spec flag with its section of the help, in the help's order: the job's, each
    backend's under its own title (the registry's order), then the training and preemption flags."""
    owned = [(cls.spec_flags_title or f"{cls.name} flags", f) for cls in api.backend_classes() for f in cls.spec_flags]
    later = [*((TRAINING, f) for f in TRAINING_FLAGS), *((PREEMPTION, f) for f in PREEMPTION_FLAGS), (TRAINING, SET)]
    return [*((JOB, f) for f in JOB_FLAGS), *owned, *later]


def spec_flags() -> list[SpecFlag]:
    """Every spec flag, in the help's order."""
    return [f for _, f in sectioned()]


def add_spec_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="job.yaml (optional: flags alone make a spec)")
    parser.add_argument(
        "--profile",
        help="a profile of ~/.config/dist-jobs/config.yaml (default: $DIST_JOBS_PROFILE, else the file's `default:`)",
    )
    groups: dict[str, Any] = {}
    for title, f in sectioned():
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        dest, text = _dest(f), f.help.replace("%", "%%")  # argparse formats help with %
        if f.kind == "true":
            group.add_argument(f.flag, dest=dest, action="store_const", const=True, help=text)
        elif f.kind in ("append", "env", "set"):
            group.add_argument(f.flag, dest=dest, action="append", metavar="VALUE", help=text)
        else:
            group.add_argument(f.flag, dest=dest, metavar="VALUE", help=text)


def _dest(f: SpecFlag) -> str:
    return "flag_" + f.flag.lstrip("-").replace("-", "_")


def overrides_from(
    args: argparse.Namespace, command: list[str] | None, deferred: list[Problem] | None = None
) -> dict[str, Any]:
    """Dotted-path overrides from the parsed flags; bad KEY=VALUE forms and unknown paths are
    collected, then raised, or added to `deferred` (to be raised with the spec's own problems)."""
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for f in spec_flags():
        value = getattr(args, _dest(f), None)
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
    # `--set train.epochs=5` should give an int and `--set train.progress=false` a bool, as in YAML;
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
    own = {f.flag for f in spec_flags()}
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
