"""Every job this user submitted from this machine, by backend: the one record of where each
one's run directory (and log folder) is, written once at submit, absolute.

`$XDG_STATE_HOME/dist-jobs/jobs/<backend>/<job>.json` (default `~/.local/state/...`): status, logs
and list read a job's folders back from here, so a handle gives the same answer from any folder
and `list` shows every job submitted here, wherever its checkpoint_dir put it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.attempts import safe_name
from dist_jobs.rundir.place import RunDir


@dataclass(frozen=True)
class Submitted:
    """One job as its backend recorded it at submit."""

    backend: str
    job_id: str  # the backend's id: a SLURM job id, a local run directory, a Kubernetes name
    run_dir: str  # absolute, as the submitting host sees it
    log_dir: str = ""  # absolute; "" where the backend keeps no log folder of its own
    job_dir: str = ""  # absolute: the backend's own record of the job (SLURM's job directory)

    @property
    def run(self) -> RunDir:
        return RunDir(Path(self.run_dir))


def folder(backend: str, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "dist-jobs" / "jobs" / backend


def _path(backend: str, job_id: str) -> Path:
    # readable, and told apart by a digest where two ids read alike (/a-b/c and /a/b-c)
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]
    return folder(backend) / f"{safe_name(job_id, 'job')[-80:]}-{digest}.json"


def record(job: Submitted) -> None:
    """Record `job` (its folders made absolute); a job id recorded before is replaced."""
    absolute = {k: os.path.abspath(v) if v and k.endswith("_dir") else v for k, v in asdict(job).items()}
    path = _path(job.backend, job.job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(absolute, indent=2) + "\n")


def recorded(backend: str, job_id: str) -> Submitted | None:
    """The record of job `job_id`, None if it was not submitted from here (or is unreadable)."""
    found = _read(_path(backend, job_id))
    return found if found is not None and found.job_id == job_id else None


def every(backend: str) -> list[Submitted]:
    """Every job recorded for `backend`, oldest record first."""
    paths = sorted(folder(backend).glob("*.json"), key=lambda p: (_mtime(p), p.name))
    return [job for job in map(_read, paths) if job is not None]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed since it was listed: read as absent
        return 0.0


def _read(path: Path) -> Submitted | None:
    try:
        data = json.loads(path.read_text())
        return Submitted(**{k: str(v) for k, v in data.items()})
    except (OSError, ValueError, TypeError):  # absent, half-written by another version, or not ours
        return None
