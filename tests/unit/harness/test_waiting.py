"""`eventually()`, the suite's one way to wait: what it returns, and what a timeout says."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from support.waiting import eventually


def test_returns_the_first_truthy_value() -> None:
    values: Iterator[object] = iter([None, 0, [], "ready"])
    assert eventually(lambda: next(values), timeout=5, interval=0, what="x") == "ready"


def test_a_timeout_fails_with_what_the_last_value_and_the_context() -> None:
    ran: list[str] = []
    with pytest.raises(pytest.fail.Exception) as info:
        eventually(
            list,
            timeout=0.05,
            interval=0.01,
            what="the job's end",
            context=lambda: "log tail",
            on_timeout=lambda: ran.append("cancelled"),
        )
    assert str(info.value) == "waited 0 s for the job's end (last seen: [])\nlog tail"
    assert ran == ["cancelled"]


def test_retry_on_means_not_yet_and_is_shown() -> None:
    def check() -> bool:
        raise FileNotFoundError("no file yet")

    with pytest.raises(pytest.fail.Exception, match=r"last seen: FileNotFoundError\('no file yet'\)"):
        eventually(check, timeout=0.05, interval=0.01, what="a file", retry_on=(FileNotFoundError,))
    with pytest.raises(ZeroDivisionError):  # any other exception is the test's failure at once
        eventually(lambda: 1 / 0, timeout=5, what="a number", retry_on=(FileNotFoundError,))


def test_until_returns_and_shows_the_real_value() -> None:
    states = iter(["PENDING", "RUNNING", "COMPLETED"])
    assert eventually(lambda: next(states), until=lambda s: s == "COMPLETED", timeout=5, interval=0, what="x") == (
        "COMPLETED"
    )
    assert eventually(list, until=lambda pids: pids == [], timeout=5, what="no pids") == []  # falsy is fine
    with pytest.raises(pytest.fail.Exception, match=r"last seen: 'RUNNING'"):
        eventually(lambda: "RUNNING", until=lambda s: s == "COMPLETED", timeout=0.05, interval=0.01, what="the end")


def test_give_up_fails_at_once_saying_why() -> None:
    calls = itertools.count()
    with pytest.raises(pytest.fail.Exception) as info:
        eventually(
            lambda: next(calls) > 100, timeout=60, interval=0, what="step 3", give_up=lambda: ["rank 1 exited 1"]
        )
    assert re.fullmatch(
        r"gave up waiting for step 3 after [\d.]+ s: \['rank 1 exited 1'\] \(last seen: False\)", str(info.value)
    )
    assert next(calls) == 1  # looked once, not for 60 s


def test_default_is_a_wait_that_may_run_out() -> None:
    ran: list[str] = []
    got = eventually(
        lambda: False, timeout=0.05, interval=0.01, what="x", default=False, on_timeout=lambda: ran.append("x")
    )
    assert got is False and ran == []
