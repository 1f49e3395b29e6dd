"""Per-rank SLURM logs: one file per rank and attempt, stitched in order (`dist-jobs logs`)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dist_jobs.backends.slurm.meta import job_meta
from dist_jobs.errors import BackendError


def attempt_files(log_dir: Path, run: str, job_id: str, rank: int) -> list[Path]:
    """Rank `rank`'s files in the order they were written: `attempt<N>` after N requeues,
    `attempt<N>.<R>` after R restarts in place within that allocation."""
    pattern = re.compile(rf"{re.escape(run)}-{re.escape(job_id)}-attempt(\d+)(?:\.(\d+))?-rank{rank}\.out$")
    found = [
        ((int(m.group(1)), int(m.group(2) or 0)), p)
        for p in log_dir.glob(f"*-{job_id}-attempt*-rank{rank}.out")
        if (m := pattern.search(p.name))
    ]
    return [p for _, p in sorted(found)]


def ranks_logged(log_dir: Path, run: str, job_id: str) -> list[int]:
    """The ranks (torchrun mode: node tasks) that have a log file of job `job_id`, in order."""
    pattern = re.compile(rf"{re.escape(run)}-{re.escape(job_id)}-attempt\d+(?:\.\d+)?-rank(\d+)\.out$")
    found = {int(m.group(1)) for p in log_dir.glob(f"*-{job_id}-attempt*-rank*.out") if (m := pattern.search(p.name))}
    return sorted(found)


def stitch_all(
    files_of: Callable[[], dict[int, list[Path]]], running: Callable[[], bool], label: str = "rank"
) -> Iterator[str]:
    """Every rank's attempts, each line `[rank N] ...`: rank after rank, and with follow (`running`)
    the new lines of every rank as they come, ranks that start later included."""
    return _follow(files_of, running, lambda rank: f"[{label} {rank}] ")


def stitch(files: list[Path], refresh: Callable[[], list[Path]], running: Callable[[], bool]) -> Iterator[str]:
    """Each attempt's file in order, with a banner; with follow, new lines and new attempts too."""
    first = [files]
    return _follow(lambda: {0: first.pop() if first else refresh()}, running, lambda rank: "")


def _follow(
    files_of: Callable[[], dict[int, list[Path]]], running: Callable[[], bool], prefix: Callable[[int], str]
) -> Iterator[str]:
    """The lines of each rank's files in order, each after a banner naming its file; while
    `running()`, every second the lines written since and the files that appeared since."""
    done: dict[Path, int] = {}
    while True:
        for rank, files in sorted(files_of().items()):
            for path in files:
                if path not in done:
                    yield f"{prefix(rank)}==> {path.name} <=="
                    done[path] = 0
                with path.open("r", errors="replace") as fh:
                    fh.seek(done[path])
                    for line in fh:
                        yield prefix(rank) + line.rstrip("\n")
                    done[path] = fh.tell()
        if not running():
            return
        time.sleep(1.0)


def rank_lines(lines: Iterator[str], rank: int, follow: bool) -> Iterator[str]:
    """Rank `rank`'s lines of a torchrun node's log, found by their `[rank R] ` prefix and given
    as the rank wrote them, and the attempt banners; without follow, a log where no line has
    the prefix (an older job's) is given whole."""
    mine = f"[rank {rank}] "
    if not follow:
        every = list(lines)
        if not any(line.startswith(mine) for line in every):
            yield from every
            return
        lines = iter(every)
    yield from (line.removeprefix(mine) for line in lines if line.startswith((mine, "==> ")))


def log_location(
    jobs_dir: Path, job_id: str, run: Callable[[list[str]], subprocess.CompletedProcess[str]]
) -> tuple[Path, str, int | None]:
    """(log folder, run name, processes per torchrun task or None for srun mode) of `job_id`:
    from what submit recorded, else from `scontrol show job` (`run` runs it) for a live job."""
    data = job_meta(jobs_dir, job_id)
    if data:
        procs = data.get("procs_per_node") if data.get("launcher") == "torchrun" else None
        return Path(data["log_dir"]), data["run"], procs
    proc = run(["scontrol", "show", "job", job_id])
    out = re.search(r"StdOut=(\S+)", proc.stdout) if proc.returncode == 0 else None
    name = re.search(r"JobName=(\S+)", proc.stdout) if proc.returncode == 0 else None
    if not out or not name:
        raise BackendError(
            f"cannot find the log folder of job {job_id}",
            f"submit with dist-jobs (it records it in {jobs_dir}) or pass a live job id",
        )
    return Path(out.group(1)).parent, name.group(1), None
