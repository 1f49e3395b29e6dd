"""Before a job is handed to a scheduler or started here: can its python run the built-in trainer?

Every backend asks this one check at submit (and the local backend before a foreground run): a
python without a package the built-in trainer imports for the chosen model and data would fail
on every rank in its first second, after the job waited in the queue; refused here instead,
with exit 2, naming the package and the python.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

from dist_jobs.errors import UsageError
from dist_jobs.spec import JobSpec
from dist_jobs.spec.train import trainer_packages

# Which of these packages the job's python cannot import (tests replace it: no torch needed there).
MissingPackages = Callable[[Sequence[str]], list[str]]


def missing_packages(names: Sequence[str]) -> list[str]:
    """Those of `names` the interpreter running dist-jobs cannot import (looked up, not imported)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def check_trainer_packages(spec: JobSpec, python: str, missing: MissingPackages) -> None:
    """Raise UsageError when the built-in trainer would run in `python` (the job runs no
    `command` of its own) and `missing` says it lacks a package the trainer needs for the spec's
    model and data."""
    if spec.command is not None:
        return
    packages = trainer_packages(spec.train)
    lacking = missing(packages)
    if lacking:
        needs = f"model {spec.train.model!r} and data {spec.train.data!r}"
        raise UsageError(
            f"the job's python ({python}) has no {' or '.join(lacking)}, which the built-in trainer needs for {needs}",
            f"pip install 'dist-jobs[train]' into it ({', '.join(packages)}), "
            "or set python: in the job spec to one that has them",
        )
