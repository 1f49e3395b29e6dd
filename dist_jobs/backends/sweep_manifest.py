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

MANIFEST = "sweep.json"
SWEEPS_DIR = "dist-jobs-sweeps"  # Kubernetes sweeps: their manifests, here (the checkpoints are in the pods' volume)


def write_manifest(root: Path, manifest: Mapping[str, Any]) -> Path:
    return write_atomic(root / MANIFEST, json.dumps(manifest, indent=2) + "\n", mkdir=True)
