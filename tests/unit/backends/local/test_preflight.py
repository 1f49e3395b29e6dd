"""The local backend refuses, before any process starts, a built-in training run whose python
lacks a package the trainer needs (the check SLURM submit makes too: dist_jobs.backends.preflight)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.backends.local.runner import LocalRunner
from dist_jobs.errors import UsageError
from dist_jobs.spec import JobSpec
from dist_jobs.spec.load import load_spec


def lacking(names: object) -> list[str]:
    return ["torchvision"]


def spec(tmp_path: Path, **extra: object) -> JobSpec:
    return load_spec(data={"name": "pre", "procs_per_node": 1, "checkpoint_dir": str(tmp_path / "ckpt"), **extra})


def test_a_run_of_the_built_in_trainer_without_its_packages_is_refused_before_it_starts(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        LocalRunner(workdir=tmp_path, missing=lacking).run(spec(tmp_path))
    assert "has no torchvision, which the built-in trainer needs for model" in str(raised.value)
    assert raised.value.exit_code == 2 and "pip install 'dist-jobs[train]'" in str(raised.value.hint)
    assert not (tmp_path / "ckpt").exists()  # nothing started, nothing written


def test_a_submit_is_refused_the_same_way_and_writes_no_record(tmp_path: Path) -> None:
    backend = LocalBackend(workdir=tmp_path, missing=lacking)
    with pytest.raises(UsageError, match="has no torchvision"):
        backend.schedule(backend.prepare(spec(tmp_path)))
    assert not (tmp_path / "ckpt").exists()


def test_a_users_own_command_needs_no_trainer_packages(tmp_path: Path) -> None:
    code = LocalRunner(workdir=tmp_path, missing=lacking).run(spec(tmp_path, command=["true"]))
    assert code == 0
