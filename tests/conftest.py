"""Test set-up: tests/ on sys.path (for `support`), and the tier gate of support.tiers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from support import tiers  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_tiers(*tiers): needs these test tiers (support.tiers)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Each tier is also a marker, so `-m 'not slurm and not apiserver'` keeps working.
    for item in items:
        for mark in item.iter_markers("requires_tiers"):
            for tier in mark.args:
                item.add_marker(getattr(pytest.mark, tier))


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires_tiers"):
        tiers.check(tuple(mark.args))


@pytest.fixture(autouse=True)
def _no_user_profiles(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The user's own ~/.config/dist-jobs/config.yaml (profiles) must not change what a test renders."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "no-user-config"))
    monkeypatch.delenv("DIST_JOBS_PROFILE", raising=False)
