"""Numbers from the environment: the one parser every layer uses (stdlib only, imports nothing).

A variable that is unset or blank gives the caller's default; one that is set must be a finite
number within the caller's bounds, else `ValueError` says which variable, what it holds and what
is allowed. The caller decides what a bad value means: the lock's timings fall back to their
defaults (a job script must not die of a typo in a tuning knob), the rendezvous timeout is
refused (a launch misconfigured on purpose should fail loudly).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping


def env_number(
    name: str,
    default: float | None,
    environ: Mapping[str, str] | None = None,
    *,
    low: float = -math.inf,
    high: float = math.inf,
) -> float | None:
    """`name`'s value as a float in [low, high], `default` when unset or blank."""
    env = os.environ if environ is None else environ
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):  # also rejects nan and inf
        raise ValueError(f"{name}={text!r} is not a number between {low:g} and {high:g}")
    return value


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None, *, floor: float = 0.05) -> float:
    """A positive number of seconds (raised to `floor`), else `default`, also for a bad value."""
    try:
        value = env_number(name, default, environ, low=0.0)
    except ValueError:
        return default
    return max(floor, default if value is None else value)
