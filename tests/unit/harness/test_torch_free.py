"""`pytest --torch-free` (the Pythons without a torch wheel) leaves out exactly the test files that
import torch when they are imported, directly or through dist_jobs and support modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.paths import REPO
from support.torch_free import file_needs_torch


@pytest.mark.parametrize(
    "source,needs",
    [
        ("import torch\n", True),
        ("import torchvision.models\n", True),
        ("from dist_jobs.train.loop import fit\n", True),  # loop imports torch
        ("import support.envscript\n", True),  # a support module that imports torch
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", True),
        ("from dist_jobs.spec import load_spec\nfrom dist_jobs.render import render\n", False),
        ("def test_x():\n    import torch\n", False),  # imported when the test runs: @requires("torch")
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
    assert file_needs_torch(REPO / "tests" / "unit" / "train" / "test_entrypoint.py")
    assert not file_needs_torch(REPO / "tests" / "unit" / "render" / "test_k8s.py")
    assert not file_needs_torch(REPO / "tests" / "unit" / "repo" / "test_docs.py")


def test_torch_free_deselects_a_test_that_requires_torch_and_keeps_the_others(pytester: pytest.Pytester) -> None:
    """The need said at the test is what `--torch-free` reads: no list elsewhere."""
    pytester.makeconftest(
        f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(REPO / "tests" / "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        globals().update({{k: v for k, v in vars(suite).items() if k.startswith("pytest_")}})
        """
    )
    pytester.makepyfile(
        test_x="""
        from support.tiers import requires

        @requires("torch")
        def test_runs_the_trainer_in_a_child():
            pass

        def test_needs_nothing():
            pass
        """
    )
    result = pytester.runpytest("--torch-free", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=1)
