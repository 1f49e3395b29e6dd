"""`-o table|json|yaml`: one place that turns records into what the user asked for.

yaml is imported only for `-o yaml`: the query verbs load no yaml (tests/unit/test_imports.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dist_jobs.rundir.progress import describe


def emit(records: Sequence[dict[str, Any]] | dict[str, Any], fmt: str, table: str) -> str:
    """`records` as JSON or YAML; `table` (already formatted) for -o table."""
    if fmt == "json":
        return json.dumps(records, indent=2)
    if fmt == "yaml":
        import yaml  # here: the query verbs load no yaml (tests/unit/test_imports.py)

        return yaml.safe_dump(records, sort_keys=False).rstrip("\n")
    return table


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns with a header line; empty cells shown as '-'."""
    cells = [list(header)] + [[c or "-" for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def info_table(info: Any) -> str:
    """One job: `HANDLE  STATE (word)  detail`, then extras and per-rank detail, one per line."""
    head = f"{info.handle}  {info.name}  {info.state} ({info.word})" + (f"  {info.detail}" if info.detail else "")
    lines = [head]
    lines += [f"  {key}: {value}" for key, value in info.extra.items() if value]
    lines += [f"  rank {rank}: {what}" for rank, what in sorted(info.ranks.items())]
    progress = getattr(info, "progress", None)
    if progress:
        lines.append(f"  progress: {describe(progress)}")
    goodput = getattr(info, "goodput", None)
    if goodput is not None:
        lines.append(f"  {goodput.told()}")
    return "\n".join(lines)
