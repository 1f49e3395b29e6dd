"""The suite's gate for a missing Python dependency: a skip locally, a failure under CI."""

from __future__ import annotations

import pytest

from support import tiers

ABSENT = "dist_jobs_no_such_dependency"


def test_a_missing_dependency_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match=f"{ABSENT} cannot be imported under CI"):
        tiers.require_module(ABSENT)


def test_a_missing_dependency_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} is not installed"):
        tiers.require_module(ABSENT)


def test_a_present_dependency_is_the_module() -> None:
    import json

    assert tiers.require_module("json") is json


def test_no_test_file_skips_on_a_missing_import_by_itself() -> None:
    # importorskip would turn a CI environment that lost torch or kubernetes green.
    found = [
        str(path.relative_to(tiers.REPO))
        for path in (tiers.REPO / "tests").rglob("*.py")
        if "importorskip(" in path.read_text(encoding="utf-8") and path.name != "test_tiers.py"
    ]
    assert not found, found
