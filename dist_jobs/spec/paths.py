"""`~` in the spec's folders: one expansion, on the submitting host, for every backend.

`checkpoint_dir: ~/ck` must be the folder the job writes, the one job.json records and the one
`status`, `Job.progress()` and `Job.result()` read. The batch script would quote `~` (a folder
named `~` under the submit directory) and a compute node may see another $HOME, so the
submitting host expands it once, here, and the job gets the absolute path. A `~user` with no
account here is refused when the spec is read rather than left as a relative folder named `~user`.
"""

from __future__ import annotations

import os
from pathlib import PurePath
from typing import TYPE_CHECKING, TypeVar

from dist_jobs.errors import Problem

if TYPE_CHECKING:  # `dist-jobs status` expands paths and loads no spec classes (msgspec, test_imports)
    from dist_jobs.spec.model import JobSpec

HOME_FIELDS = ("checkpoint_dir", "log_dir", "workdir")
P = TypeVar("P", bound=PurePath)


def expand_home(path: str) -> str:
    """`~` ($HOME) and `~user` (the account's home) at the start of `path` as this host knows them;
    any other path as written (no normalisation: a trailing space or newline stays)."""
    return os.path.expanduser(path) if path.startswith("~") else path


def checkpoint_root(checkpoint_dir: str, workdir: P) -> P:
    """The spec's checkpoint_dir as the job reads it: `~` expanded on this host, a relative one
    below `workdir` (the folder the job runs in; a pod's volume mount on Kubernetes)."""
    root = type(workdir)(expand_home(checkpoint_dir))
    return root if root.is_absolute() else workdir / root


def home_problems(spec: JobSpec) -> list[Problem]:
    """A `~user` in checkpoint_dir, log_dir or workdir whose user this host does not know."""
    problems = []
    for field in HOME_FIELDS:
        value = getattr(spec, field)
        if value and value.startswith("~") and expand_home(value) == value:
            user = value[1:].split("/", 1)[0]
            problems.append(
                Problem(
                    field,
                    value,
                    f"starts with ~{user}, but this host has no user {user!r} (and no $HOME for `~`) to expand it",
                    "write the folder out in full, e.g. /home/NAME/ck, or use ~/ for your own home",
                )
            )
    return problems
