"""Code snapshots: the job runs the code as it was when it was submitted, not as edited since.

`submit --snapshot` (spec `snapshot: true`; sweeps by default) copies the job's code into a folder
of its own under the jobs directory, `<jobs_dir>/snapshots/<run>-<time>-<pid>[-n]/`, and the job's
working directory becomes that folder: every attempt, requeues included, starts there. The
backend's `prepare()` plans it (`planned`: the folder, the spec rewritten to run there, nothing
written), so `submit --dry-run` shows what the job runs with; `submit` copies (`take`) into
exactly the planned folder. Every backend that copies the code to a folder (SLURM, local) uses
this pair. What is
copied: in a git work tree, the tracked files plus untracked ones .gitignore does not exclude
(`git ls-files -co --exclude-standard`), uncommitted changes as they are on disk; elsewhere, the
folder minus data, checkpoint, log and environment folders. More than `limit` bytes is refused
with the biggest folders named. SNAPSHOT.json in the copy records the commit and whether the
tree had uncommitted changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.backends.base import SnapshotPlan, run_dir_of
from dist_jobs.errors import UsageError
from dist_jobs.spec.paths import expand_home

if TYPE_CHECKING:  # `dist-jobs status` reads a job's snapshot record and loads no spec classes (msgspec)
    from dist_jobs.spec import JobSpec

RECORD = "SNAPSHOT.json"
LIMIT_BYTES = 256 * 1024 * 1024
# Never code: what a training folder holds besides its code, when there is no .gitignore to say so.
SKIPPED = frozenset(
    {".git", "__pycache__", ".venv", "venv", "env", "node_modules", "data", "datasets", "checkpoints", "logs"}
    | {"dist-jobs-runs", "runs", "wandb", "outputs", "mlruns", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)


def plan(
    spec: JobSpec, workdir: Path, into: Path, now: float, limit: int = LIMIT_BYTES
) -> tuple[JobSpec, SnapshotPlan]:
    """`spec` to run from a snapshot of the code in `workdir` that goes under `into` (named for
    the time `now`), and that snapshot's plan; nothing is written. The copy becomes the spec's
    workdir; its log and checkpoint folders stay where they were (made absolute), and PYTHONPATH
    entries inside the code point into the copy. More than `limit` bytes of code is refused now,
    at the dry run already."""
    import msgspec  # a copy's spec alone: `dist-jobs status` loads no msgspec (test_imports)

    logs = Path(expand_home(spec.log_dir))
    logs = logs if logs.is_absolute() else workdir / logs
    checkpoints = run_dir_of(spec, workdir).root
    snap = SnapshotPlan(workdir.resolve(), destination(into, spec.run_id, now), (into, logs, checkpoints))
    listing(snap.source, list(snap.exclude), limit)  # the size guard
    env = dict(spec.env)
    if "PYTHONPATH" not in env and os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            _into(Path(entry), snap.source, snap.dest) for entry in os.environ["PYTHONPATH"].split(os.pathsep)
        )
    snapped = msgspec.structs.replace(
        spec, workdir=str(snap.dest), log_dir=str(logs), checkpoint_dir=str(checkpoints), env=env
    )
    return snapped, snap


def planned(spec: JobSpec, workdir: Path, into: Path, now: float) -> tuple[JobSpec, SnapshotPlan | None]:
    """What `prepare()` submits: with `snapshot`, `spec` to run from a copy planned under `into`
    (plan); else, or where it runs from a copy already (a sweep's trial), `spec` as it is."""
    if not spec.snapshot or in_copy(spec):
        return spec, None
    return plan(spec, workdir, into, now)


def destination(into: Path, run: str, now: float) -> Path:
    """`<into>/snapshots/<run>-<time>-<pid>[-n]`: a folder no snapshot has taken yet."""
    name = f"{run}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{os.getpid()}"
    dest, n = into / "snapshots" / name, 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{name}-{n}")
    return dest


def take(snap: SnapshotPlan, limit: int = LIMIT_BYTES) -> dict[str, Any]:
    """Copy the code as `snap` plans, into exactly its `dest`; its record (folder, commit,
    dirty, files, bytes). The code is listed again: the copy holds it as it is now, at submit."""
    files, commit, dirty, size = listing(snap.source, list(snap.exclude), limit)
    dest = snap.dest
    try:
        dest.mkdir(parents=True)
    except FileExistsError:
        raise UsageError(
            f"snapshot: {dest} exists already: another submit copied its code there",
            "submit the job again: its dry run picks a folder no snapshot has taken",
        ) from None
    for rel in files:
        _copy(snap.source / rel, dest / rel)
    record = {"dir": str(dest), "source": str(snap.source), "commit": commit, "dirty": dirty, "files": len(files)}
    record["bytes"] = size
    (dest / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def listing(source: Path, exclude: list[Path], limit: int) -> tuple[list[str], str | None, bool | None, int]:
    """What a snapshot of `source` (resolved) holds: (files relative to it, commit, dirty, bytes);
    more than `limit` bytes raises the size guard's UsageError."""
    skip = [p.resolve() for p in exclude]
    git = _git_files(source)
    files = git[0] if git is not None else _walk(source)
    files = [f for f in files if not any(_inside(source / f, s) for s in skip)]
    size = sum(_size(source / f) for f in files)
    if size > limit:
        raise _too_big(source, files, size, limit, git is not None)
    commit, dirty = (git[1], git[2]) if git is not None else (None, None)
    return files, commit, dirty, size


def read(workdir: Path) -> dict[str, Any] | None:
    """The snapshot record of a job whose working directory is `workdir`; None if it is no snapshot."""
    try:
        return dict(json.loads((workdir / RECORD).read_text()))
    except (OSError, ValueError):
        return None


def describe(record: dict[str, Any]) -> str:
    """`snapshot of 1a2b3c4 (with uncommitted changes) in DIR` for status."""
    commit = record.get("commit")
    what = f"snapshot of {str(commit)[:12]}" if commit else "snapshot (no git commit)"
    if record.get("dirty"):
        what += " (with uncommitted changes)"
    return f"{what} in {record.get('dir')}"


def in_copy(spec: JobSpec) -> bool:
    """Whether `spec` already runs from a snapshot (a sweep's trials share the sweep's one)."""
    return spec.workdir is not None and read(Path(spec.workdir)) is not None


def _into(entry: Path, source: Path, copy: Path) -> str:
    try:
        return str(copy / entry.resolve().relative_to(source))
    except ValueError:
        return str(entry)


def _git(source: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def _git_files(source: Path) -> tuple[list[str], str | None, bool] | None:
    """(files relative to `source`, HEAD commit or None, dirty) in a git work tree; None outside one."""
    listed = _git(source, "ls-files", "-co", "--exclude-standard", "-z")
    if listed is None or listed.returncode != 0:
        return None
    files = [f for f in listed.stdout.decode().split("\0") if f and (source / f).exists()]
    head = _git(source, "rev-parse", "HEAD")
    commit = head.stdout.decode().strip() if head is not None and head.returncode == 0 else None
    status = _git(source, "status", "--porcelain", "--", ".")
    dirty = bool(status.stdout.strip()) if status is not None and status.returncode == 0 else True
    return sorted(set(files)), commit, dirty


def _walk(source: Path) -> list[str]:
    out = []
    for folder, dirs, names in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and not d.startswith(".snapshot"))
        out += [os.path.relpath(os.path.join(folder, n), source) for n in names]
    return sorted(out)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
        return True
    except ValueError:
        return False


def _size(path: Path) -> int:
    try:
        return 0 if path.is_symlink() else path.stat().st_size
    except OSError:
        return 0


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_file():
        shutil.copy2(src, dst)


def _too_big(source: Path, files: list[str], size: int, limit: int, git: bool) -> UsageError:
    tops: dict[str, int] = {}
    for rel in files:
        top = rel.split(os.sep, 1)[0]
        tops[top] = tops.get(top, 0) + _size(source / rel)
    biggest = ", ".join(f"{k} ({v / 2**20:.0f} MiB)" for k, v in sorted(tops.items(), key=lambda kv: -kv[1])[:3])
    fix = "add them to .gitignore" if git else "move data and checkpoints out of the code folder, or use git"
    return UsageError(
        f"snapshot: {source} holds {size / 2**20:.0f} MiB to copy, more than the {limit / 2**20:.0f} MiB limit "
        f"(biggest: {biggest})",
        f"{fix}; or submit without a snapshot (snapshot: false, no --snapshot)",
    )
