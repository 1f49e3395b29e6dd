"""dist_jobs.envnum: the one parser of numbers from the environment."""

from __future__ import annotations

import pytest

from dist_jobs.envnum import env_number, env_seconds
from dist_jobs.rundir.holder import heartbeat_seconds


def test_unset_or_blank_gives_the_default_and_a_number_parses() -> None:
    assert env_number("X", 7.0, {}) == 7.0
    assert env_number("X", None, {"X": "  "}) is None
    assert env_number("X", 7.0, {"X": " 2.5 "}) == 2.5


@pytest.mark.parametrize("bad", ["abc", "nan", "inf", "-1", "1e9"])
def test_a_bad_value_names_the_variable_and_what_it_holds(bad: str) -> None:
    with pytest.raises(ValueError, match=f"X='{bad}' is not a number between 0 and 100"):
        env_number("X", 1.0, {"X": bad}, low=0, high=100)


def test_seconds_fall_back_on_a_bad_value_and_stay_above_the_floor() -> None:
    assert env_seconds("S", 10.0, {"S": "soon"}) == 10.0
    assert env_seconds("S", 10.0, {"S": "inf"}) == 10.0  # float() took it before: a heartbeat never sent
    assert env_seconds("S", 10.0, {"S": "0"}) == 0.05
    assert heartbeat_seconds({"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "nan"}) == 10.0
