"""What `dist-jobs env` prints: the resolved rank and the env:// variables it would export."""

from __future__ import annotations

import json
from dataclasses import asdict

from dist_jobs.ranks.base import RankInfo


def as_table(info: RankInfo) -> str:
    """Two aligned columns, one field per line, then the variables `export()` sets."""
    rows = [(field, str(value)) for field, value in asdict(info).items()]
    rows.append(("", ""))
    rows += [(name, value) for name, value in info.env_vars().items()]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}".rstrip() for name, value in rows)


def as_json(info: RankInfo) -> str:
    """The fields, plus `env`: the env:// variables, as one JSON object."""
    return json.dumps({**asdict(info), "env": info.env_vars()}, indent=2)
