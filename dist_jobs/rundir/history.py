"""`<run dir>/metrics.jsonl`, the run's append-only log: one JSON line per write, appended in one
write (O_APPEND, so a line lands whole), and read back line by line, a torn or foreign line
skipped. Rank 0 of the trainer appends a row per log interval (dist_jobs.rundir.progress reads
them); a holder that takes the run directory over from another appends its takeover row first
(dist_jobs.rundir.lock), which retires its predecessor's stamp (dist_jobs.rundir.stamps).
Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

HISTORY = "metrics.jsonl"
TOOK_OVER = "took_over"  # a takeover row: {"took_over": <predecessor's stamp>, "stamp": ..., "time": ...}


def append_history(run_dir: Path, row: Mapping[str, object]) -> None:
    """Append one JSON line to `<run_dir>/metrics.jsonl` in one write."""
    run_dir.mkdir(parents=True, exist_ok=True)
    line = json.dumps(dict(row), sort_keys=True, allow_nan=False, default=str) + "\n"
    with open(run_dir / HISTORY, "a", encoding="utf-8") as fh:  # O_APPEND: a line lands whole
        fh.write(line)
        fh.flush()


def read_objects(path: Path) -> list[dict[str, object]]:
    """Every line of a JSON-lines file that parses as an object, oldest first; a torn last line
    (its writer killed mid-line) and foreign lines are skipped, and a missing file has none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
