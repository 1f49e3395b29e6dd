"""A sweep's manifest and folders, whichever backend runs it (each backend's sweep behaviour is
its Backend's: `prepare_sweep`, `submit_sweep`, `cancel_sweep`, ...).

A sweep's folder holds its manifest, `sweep.json`: the trials, their parameters and handles.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.spec.paths import expand_home

MANIFEST = "sweep.json"
SWEEPS_DIR = "dist-jobs-sweeps"  # Kubernetes sweeps: their manifests, here (the checkpoints are in the pods' volume)


def write_manifest(root: Path, manifest: Mapping[str, Any]) -> Path:
    return write_atomic(root / MANIFEST, json.dumps(manifest, indent=2) + "\n", mkdir=True)


def absolute(folder: str, base: Path, workdir: str | None = None) -> Path:
    """`folder` as the jobs have it: `~` expanded here (as the renderers do), relative to the workdir."""
    path = Path(expand_home(folder))
    if path.is_absolute():
        return path
    return (base / expand_home(workdir) / path if workdir else base / path).resolve()
