"""The fake backend, registered for this folder's tests alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dist_jobs.backends import register_backend, unregister_backend

from .backend import FakeBackend


@pytest.fixture(autouse=True)
def fake_backend() -> Iterator[type[FakeBackend]]:
    register_backend("fake", f"{FakeBackend.__module__}:{FakeBackend.__name__}")
    FakeBackend.queues.clear()
    yield FakeBackend
    unregister_backend("fake")
    FakeBackend.queues.clear()
