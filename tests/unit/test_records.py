"""`dist_jobs.records.Record`: what the frozen dataclasses it replaced on the query path gave."""

from __future__ import annotations

import pickle

import pytest

from dist_jobs.backends.base import JobStatus
from dist_jobs.errors import Problem
from dist_jobs.records import Record


class Point(Record):
    x: int
    y: int = 0
    tags: dict[str, str] = {}


def test_fields_positional_keyword_and_defaults() -> None:
    assert Point(1).as_dict() == {"x": 1, "y": 0, "tags": {}}
    assert Point(1, y=2) == Point(x=1, y=2) != Point(1, 3)
    assert repr(Point(1, 2)) == "Point(x=1, y=2, tags={})"


def test_a_mutable_default_is_not_shared() -> None:
    a, b = Point(1), Point(2)
    a.tags["k"] = "v"
    assert b.tags == {} and JobStatus("1", "n", "RUNNING").extra == {}


def test_wrong_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="missing argument 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes 3 arguments, 4 given"):
        Point(1, 2, {}, 4)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected or repeated argument 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="unexpected or repeated argument 'z'"):
        Point(1, z=2)  # type: ignore[call-arg]


def test_immutable_with_replace() -> None:
    p = Problem("nodes", 0, "must be at least 1", "nodes: 1")
    with pytest.raises(AttributeError, match="immutable"):
        p.field = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del p.hint  # type: ignore[misc]
    q = p.replace(value=-1)
    assert (q.field, q.value, p.value) == ("nodes", -1, 0)


def test_hash_equality_and_pickle() -> None:
    p = Problem("a", 1, "bad")
    assert {p, Problem("a", 1, "bad", "")} == {p} and p != ("a", 1, "bad", "")
    assert pickle.loads(pickle.dumps(p)) == p
    assert pickle.loads(pickle.dumps(JobStatus("1", "n", "RUNNING", ranks={0: "ok"}))).ranks == {0: "ok"}
