"""`pytest --torch-free` (the Pythons without a torch wheel) leaves out exactly the test files that
import torch when they are imported, directly or through dist_jobs and support modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.needs_torch import ALL, IN_A_CHILD, file_needs_torch
from support.paths import REPO


@pytest.mark.parametrize(
    "source,needs",
    [
        ("import torch\n", True),
        ("import torchvision.models\n", True),
        ("from dist_jobs.train.loop import fit\n", True),  # loop imports torch
        ("import support.envscript\n", True),  # a support module that imports torch
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", True),
        ("from dist_jobs.spec import load_spec\nfrom dist_jobs.render import render\n", False),
        ("def test_x():\n    import torch\n", False),  # imported when the test runs: mark it torch
        ("from dist_jobs.train import __doc__\n", False),  # the package's __init__ is torch-free
        ('from support.tiers import require_module\nrequire_module("torch")\n', True),
        ('from support.tiers import require_module\nk8s = require_module("kubernetes")\n', False),
    ],
)
def test_a_file_needs_torch_when_importing_it_imports_torch(tmp_path: Path, source: str, needs: bool) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert file_needs_torch(path) is needs


def test_the_suites_own_files() -> None:
    assert file_needs_torch(REPO / "tests" / "unit" / "test_train_units.py")
    assert not file_needs_torch(REPO / "tests" / "unit" / "test_render_k8s.py")
    assert not file_needs_torch(REPO / "tests" / "unit" / "test_docs.py")


def test_every_test_listed_as_needing_torch_in_a_child_exists() -> None:
    import re

    for relative, names in IN_A_CHILD.items():
        path = REPO / "tests" / relative
        assert path.is_file(), relative
        assert not file_needs_torch(path), f"{relative} imports torch: --torch-free leaves it out whole already"
        defined = set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
        assert names is ALL or names <= defined, (relative, sorted(names - defined))
