"""Where a run lives: `RunDir`, the one value every backend, verb and trainer asks.

Built once from the spec and the host's view (dist_jobs.backends.base.run_dir_of on the submit
side, the trainer's checkpoint_folder from the variables the backend set), recorded absolute at
submit (dist_jobs.backends.records), and read back from there by status, logs and list, so a
handle gives the same answer from any folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    """`<checkpoint root>/<run>`, absolute as the host that built it sees it."""

    path: Path

    @classmethod
    def at(cls, root: str | Path, run: str) -> RunDir:
        """The run `run` below checkpoint root `root`; a relative root is taken from this
        process's folder (callers with another view pass it absolute)."""
        return cls(Path(os.path.abspath(Path(root) / run)))

    @property
    def root(self) -> Path:
        """The checkpoint root, as the job's DIST_JOBS_CHECKPOINT_DIR names it."""
        return self.path.parent

    @property
    def run(self) -> str:
        return self.path.name

    def __str__(self) -> str:
        return str(self.path)
