"""SLURM durations, the one parser: time limits as users write them and as sacct/squeue print them.

SLURM's forms are minutes, minutes:seconds, hours:minutes:seconds, days-hours,
days-hours:minutes and days-hours:minutes:seconds. So `1:00` is one minute, not one hour.
"""

from __future__ import annotations

import re

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
# What squeue/sacct print for a job without a limit (or before one is known).
NO_LIMIT = frozenset({"UNLIMITED", "INFINITE", "NOT_SET", "INVALID", "N/A", ""})


def parse_time(value: str | int) -> int | None:
    """SLURM time -> seconds; None when it is not one of SLURM's forms. A number is minutes (the
    spec's `time: 90`, as YAML reads it)."""
    match = _TIME.match(str(value).strip())
    if not match:
        return None
    days, a, b, c = match.groups()
    if days is None:
        if b is None:  # minutes
            return int(a) * 60
        if c is None:  # MM:SS
            return int(a) * 60 + int(b)
        return int(a) * 3600 + int(b) * 60 + int(c)
    hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
    return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds


def format_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}" if days else f"{hours:02d}:{minutes:02d}:{secs:02d}"
