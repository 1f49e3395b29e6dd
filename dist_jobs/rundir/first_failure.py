"""Which worker of a torchrun failed first: its global rank, for the verdict of whoever started it.

torchrun's exit code says how its first failed worker ended (dist_jobs.train.torchrun: 137 for a
SIGKILL), not which rank that was. Where the starter asks for it (DIST_JOBS_FIRST_FAILURE names a
file of its own), torchrun notes the rank there, and the verdict names it: `rank 3 killed by
SIGKILL (exit 137) on pods-worker-0`, not the pod alone. The pod entrypoint asks; a note whose
code is not the program's exit code is another program's, and is not believed. Stdlib only: the
pod entrypoint's verdict runs in any image.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.verdict import Failure

ENV = "DIST_JOBS_FIRST_FAILURE"


def note(rank: int, code: int) -> None:
    """Note the first failed worker's global rank and exit code where the starter asked (nowhere
    if it did not); a note that cannot be written leaves the verdict naming no rank."""
    path = os.environ.get(ENV, "")
    if path:
        with contextlib.suppress(OSError):
            write_atomic(Path(path), json.dumps({"rank": rank, "code": code}), durable=False)


def failure(path: str, code: int, where: str) -> Failure:
    """The failure of a program that exited `code` on `where` (a pod): its first failed rank where
    torchrun noted one for this code at `path`, else none named."""
    try:
        noted = json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        noted = None
    if isinstance(noted, dict) and noted.get("code") == code and isinstance(noted.get("rank"), int):
        return Failure(noted["rank"], where, code)
    return Failure(None, where, code)
