"""The trainer finds its run directory where the backend recorded it: both go through RunDir
(dist_jobs.rundir.place), the backend from the spec and its view (backends.base.run_dir_of),
the trainer from the variables that backend gives its ranks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.backends.k8s.backend import K8sBackend
from dist_jobs.backends.local.runner import LocalRunner, plan
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.resume import checkpoint_folder
from support.tiers import requires

pytestmark = requires("torch")
SPEC = {"name": "agree", "nodes": 1, "procs_per_node": 2, "command": ["python3", "-c", "pass"]}


@pytest.mark.parametrize("checkpoint_dir", ["ck", "../shared/ck", "/abs/ck"])
def test_a_local_ranks_run_directory_is_the_one_prepare_names(tmp_path: Path, checkpoint_dir: str) -> None:
    workdir = tmp_path / "project"
    spec = load_spec(data={**SPEC, "checkpoint_dir": checkpoint_dir})
    prepared = LocalRunner(workdir=workdir).prepare(spec)
    assert prepared.run_dir is not None
    for proc in plan(spec, workdir, 29500, "1", use_gpus=False):
        assert checkpoint_folder(TrainConfig(), proc.env) == prepared.run_dir.path


def _env_vars(node: Any) -> Iterator[dict[str, Any]]:
    """Every `{name, value}` of a manifest, wherever it sits."""
    if isinstance(node, dict):
        if isinstance(node.get("name"), str) and "value" in node:
            yield node
        for value in node.values():
            yield from _env_vars(value)
    elif isinstance(node, list):
        for value in node:
            yield from _env_vars(value)


@pytest.mark.parametrize("checkpoint_dir", ["ck", "/abs/ck"])
def test_a_pods_run_directory_is_the_one_prepare_names_as_the_pods_see_it(checkpoint_dir: str) -> None:
    k8s = {"image": "r/t:1", "k8s": {"mount_path": "/mnt/vol"}}
    spec = load_spec(data={**SPEC, **k8s, "checkpoint_dir": checkpoint_dir}, backend="k8s")
    prepared = K8sBackend().prepare(spec)
    env = {var["name"]: str(var["value"]) for doc in yaml.safe_load_all(prepared.payload) for var in _env_vars(doc)}
    assert prepared.run_dir is not None
    assert checkpoint_folder(TrainConfig(), env) == prepared.run_dir.path
    assert str(prepared.run_dir.path).startswith("/mnt/vol/" if checkpoint_dir == "ck" else "/abs/ck/")
