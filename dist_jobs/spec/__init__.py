"""The spec layer: the job spec's types, loading and validation. Imports only `errors` and msgspec/yaml.

`load_spec` is the way in: it validates everything at once and raises one SpecError.

The names below are imported on first use, so a module of this package that needs no spec class
(slurm_time, which `dist-jobs status` parses squeue's times with) costs no msgspec or yaml.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # PEP 562 below: these names are imported on first use, for mypy here
    from dist_jobs.spec.load import load_spec
    from dist_jobs.spec.model import JobSpec, json_schema, run_id
    from dist_jobs.spec.train import TrainConfig

__all__ = ["JobSpec", "TrainConfig", "json_schema", "load_spec", "run_id"]
_HOME = {"load_spec": "load", "JobSpec": "model", "json_schema": "model", "run_id": "model", "TrainConfig": "train"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'dist_jobs.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dist_jobs.spec.{_HOME[name]}"), name)
