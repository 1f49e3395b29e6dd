"""What the operating system and the schedulers accept, checked when the spec is read, not at start.

An argument or environment entry longer than Linux's MAX_ARG_STRLEN (128 KiB) makes exec fail
with E2BIG on every node (container mounts and the image are arguments of srun or apptainer);
a path of PATH_MAX (4,096 bytes, the NUL included) or more, or a component longer than NAME_MAX
(255 bytes), makes mkdir or open fail; a program, image, python or mount that starts with '-'
reads as an option to srun, apptainer or torchrun; sbatch turns a time limit beyond its range
into nonsense (99999999 minutes became 10825 days).
"""

from __future__ import annotations

from dist_jobs.errors import MISSING, Problem
from dist_jobs.spec.model import JobSpec
from dist_jobs.spec.slurm_time import format_time, parse_time

MAX_ARG_BYTES = 128 * 1024 - 1  # MAX_ARG_STRLEN counts the terminating NUL
NAME_MAX = 255
PATH_MAX = 4096  # counts the terminating NUL
MAX_TIME_S = 365 * 86400


def limit_problems(spec: JobSpec) -> list[Problem]:
    problems = _argv_problems(spec) + _option_problems(spec)
    for name, value in spec.env.items():
        if len(f"{name}={value}".encode("utf-8", "surrogateescape")) > MAX_ARG_BYTES:
            problems.append(_too_long(f"env.{name}", "NAME=VALUE"))
    paths = {
        "checkpoint_dir": spec.checkpoint_dir,
        "log_dir": spec.log_dir,
        "workdir": spec.workdir,
        "python": spec.python,
        "k8s.mount_path": spec.k8s.mount_path,
        "train.checkpoint_dir": spec.train.checkpoint_dir,
        "train.data_root": spec.train.data_root,
    }
    for field, path in paths.items():
        problems += _path_problems(field, path or "")
    seconds = parse_time(spec.time) if spec.time else None
    if seconds is not None and seconds > MAX_TIME_S:
        problems.append(
            Problem(
                "time",
                spec.time,
                f"is {format_time(seconds)}, beyond any cluster's limit (at most {format_time(MAX_TIME_S)})",
                "ask for what the partition allows (`sinfo -o '%P %l'`), or omit time for its default",
            )
        )
    return problems


def _argv_problems(spec: JobSpec) -> list[Problem]:
    problems = []
    if spec.command and (not spec.command[0] or spec.command[0].startswith("-")):
        problems.append(
            Problem(
                "command[0]",
                spec.command[0],
                "is not a program: srun and torchrun would read a leading '-' as their own option",
                "give the program first, e.g. [python3, -u, train.py]",
            )
        )
    for index, arg in enumerate(spec.argv):
        if _bytes(arg) > MAX_ARG_BYTES:
            where = f"command[{index}]" if spec.command else "train (one of its flags)"
            problems.append(_too_long(where, "argument"))
    return problems


def _path_problems(field: str, path: str) -> list[Problem]:
    if _bytes(path) >= PATH_MAX:
        why = f"is a path of {_bytes(path)} bytes; the system allows {PATH_MAX - 1} (PATH_MAX)"
        return [Problem(field, path[:40] + "...", why, "use a shorter path, e.g. through a symlink")]
    longest = max(path.split("/"), key=_bytes, default="")
    if _bytes(longest) > NAME_MAX:
        why = f"has a path component of {_bytes(longest)} bytes; file systems allow {NAME_MAX}"
        return [Problem(field, longest[:40] + "...", why, "shorten that folder or file name")]
    return []


def _option_problems(spec: JobSpec) -> list[Problem]:
    """Values that become words of srun's, apptainer's or torchrun's argv: within MAX_ARG_STRLEN,
    and none starting with '-', which the tool would read as one of its own options."""
    mounts = spec.slurm.container_mounts
    words = {
        "image": spec.image,
        "python": spec.python,
        **{f"slurm.container_mounts[{i}]": m for i, m in enumerate(mounts)},
    }
    problems = []
    for field, word in words.items():
        if word is not None and word.startswith("-"):
            fix = (
                "give the image itself, e.g. docker://registry/team/train:1 or ./train.sif"
                if field == "image"
                else "give the path itself (./" + word + " for a file whose name starts with '-')"
            )
            why = "starts with '-': srun, apptainer or torchrun would read it as one of their own options"
            problems.append(Problem(field, word, why, fix))
        elif word is not None and field != "python" and _bytes(word) > MAX_ARG_BYTES:  # python: PATH_MAX
            problems.append(_too_long(field, "argument"))
    if mounts and not any(_bytes(m) > MAX_ARG_BYTES for m in mounts) and _bytes(",".join(mounts)) > MAX_ARG_BYTES:
        problems.append(_too_long("slurm.container_mounts", "comma-separated argument (all mounts together)"))
    return problems


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def _too_long(field: str, what: str) -> Problem:
    return Problem(
        field,
        MISSING,
        f"is longer than {MAX_ARG_BYTES + 1} bytes as one {what}: exec fails with 'Argument list too long'",
        "pass large data through a file and give its path",
    )
