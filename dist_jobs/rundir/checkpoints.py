"""Which checkpoints of a run count: `<run dir>/step-<N>/` with its `COMPLETE` marker in it.

The trainer's Checkpointer (dist_jobs.train.checkpoint.checkpointer) resumes from these and
`dist-jobs status` names the newest: one reader for both, stdlib only, so status needs no torch.
`latest` is only a pointer rank 0 moves after a commit; the marker is what makes a step count.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

COMPLETE = "COMPLETE"
LATEST = "latest"
_STEP_RE = re.compile(r"^step-(\d+)$")


def committed_steps(directory: Path) -> list[int]:
    """The steps committed in `directory`, in no particular order; [] when there is none.
    A folder that exists but cannot be listed raises OSError: a resume must not take it for empty."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    steps = [int(m.group(1)) for m in map(_STEP_RE.match, names) if m]
    return [s for s in steps if (directory / f"step-{s}" / COMPLETE).is_file()]


def newest_committed(directory: Path) -> int | None:
    """The newest committed step; None when there is none or the folder cannot be read."""
    try:
        return max(committed_steps(directory), default=None)
    except OSError:
        return None
