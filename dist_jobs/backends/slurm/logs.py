"""Per-rank SLURM logs: one file per rank and attempt, stitched in order (`dist-jobs logs`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def attempt_files(log_dir: Path, run: str, job_id: str, rank: int) -> list[Path]:
    pattern = re.compile(rf"{re.escape(run)}-{re.escape(job_id)}-attempt(\d+)-rank{rank}\.out$")
    found = [
        (int(m.group(1)), p)
        for p in log_dir.glob(f"*-{job_id}-attempt*-rank{rank}.out")
        if (m := pattern.search(p.name))
    ]
    return [p for _, p in sorted(found)]


def ranks_logged(log_dir: Path, run: str, job_id: str) -> list[int]:
    """The ranks (torchrun mode: node tasks) that have a log file of job `job_id`, in order."""
    pattern = re.compile(rf"{re.escape(run)}-{re.escape(job_id)}-attempt\d+-rank(\d+)\.out$")
    found = {int(m.group(1)) for p in log_dir.glob(f"*-{job_id}-attempt*-rank*.out") if (m := pattern.search(p.name))}
    return sorted(found)


def stitch_all(
    files_of: Callable[[], dict[int, list[Path]]], running: Callable[[], bool], label: str = "rank"
) -> Iterator[str]:
    """Every rank's attempts, each line `[rank N] ...`: rank after rank, and with follow (`running`)
    the new lines of every rank as they come, ranks that start later included."""
    done: dict[Path, int] = {}
    while True:
        for rank, files in sorted(files_of().items()):
            for path in files:
                if path not in done:
                    yield f"[{label} {rank}] ==> {path.name} <=="
                    done[path] = 0
                with path.open("r", errors="replace") as fh:
                    fh.seek(done[path])
                    for line in fh:
                        yield f"[{label} {rank}] {line.rstrip(chr(10))}"
                    done[path] = fh.tell()
        if not running():
            return
        time.sleep(1.0)


def stitch(files: list[Path], refresh: Callable[[], list[Path]], running: Callable[[], bool]) -> Iterator[str]:
    """Each attempt's file in order, with a banner; with follow, new lines and new attempts too."""
    done: dict[Path, int] = {}
    while True:
        for path in files:
            if path not in done:
                yield f"==> {path.name} <=="
                done[path] = 0
            with path.open("r", errors="replace") as fh:
                fh.seek(done[path])
                for line in fh:
                    yield line.rstrip("\n")
                done[path] = fh.tell()
        if not running():
            return
        time.sleep(1.0)
        files = refresh()
