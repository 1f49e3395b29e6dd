"""`SlurmBackend.prepare` and `submit`: the script (for the copy of the code a snapshot plans), and
a job directory (spec copy, the exact script, job.json) written next to `sbatch --parsable` on
those same bytes. Its own module, imported on submit: status, list, cancel and logs load no yaml
or msgspec (tests/unit/test_imports.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import yaml

from dist_jobs.backends import records
from dist_jobs.backends.base import Prepared, run_dir_of
from dist_jobs.backends.preflight import MissingPackages, check_trainer_packages
from dist_jobs.backends.slurm.limits import SINFO_FORMAT, TOO_BIG, too_big
from dist_jobs.backends.slurm.sbatch import parse_sbatch_job_id, sbatch_error
from dist_jobs.backends.snapshot import plan, planned, read, take
from dist_jobs.errors import BackendError
from dist_jobs.render import render
from dist_jobs.spec import JobSpec
from dist_jobs.spec.paths import expand_home

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def job_python_export(spec: JobSpec, python: str, missing: MissingPackages) -> list[str]:
    """`--export=ALL,DIST_JOBS_PYTHON=...`: `python` (the interpreter running this submit, unless
    DIST_JOBS_PYTHON named another) is the job's python.

    It has dist-jobs by definition, so a job submitted from a shell without the venv active
    still finds it (the script falls back to python3 on PATH without it). A spec that names its
    `python` wins. Raises when the built-in trainer would start in this python and it lacks a
    package the trainer imports for this model and data (`missing`): every rank would fail in
    its first second, on every node, after the job waited in the queue.
    """
    if not spec.python and python == sys.executable:  # an interpreter this process can look into
        check_trainer_packages(spec, python, missing)
    if spec.python or "," in python:  # sbatch splits --export at commas
        return []
    return [f"--export=ALL,DIST_JOBS_PYTHON={python}"]


def prepare(spec: JobSpec, cwd: Path, jobs_dir: Path, now: float) -> Prepared:
    """SlurmBackend.prepare: the script; with `snapshot`, rendered for the copy of the code that
    schedule() makes, its folder planned under `jobs_dir` (for the time `now`) and nothing written."""
    spec, code = planned(spec, workdir_of(spec, cwd), jobs_dir, now)
    run_dir = run_dir_of(spec, workdir_of(spec, cwd))
    return Prepared("slurm", spec, render(spec, "slurm"), f"{spec.run_id}.sbatch", run_dir, code)


def snapshot(spec: JobSpec, cwd: Path, jobs_dir: Path, now: float) -> JobSpec:
    """SlurmBackend.snapshot: `spec` to run from one copy of its code, made now under `jobs_dir`
    (a sweep's, which its array's tasks share)."""
    snapped, code = plan(spec, workdir_of(spec, cwd), jobs_dir, now)
    take(code)
    return snapped


def submit(prepared: Prepared, run: Runner, cwd: Path, jobs_dir: Path, export: list[str]) -> str:
    """Submit through `run`; the job id. Relative folders of the spec are taken from `cwd`;
    `export` is sbatch's `--export` for the job's python (job_python_export). With a snapshot,
    the code is copied first, into the folder the script was rendered for."""
    if prepared.snapshot is not None:
        take(prepared.snapshot)
    folders = folders_of(prepared, cwd)
    log_dir = folders[0]
    # slurmd opens --output before the script runs: a missing folder fails the job at once
    # ("Could not open stdout file"), so it must exist at submit time (a shared filesystem).
    created = _missing_dirs(log_dir) + _missing_dirs(jobs_dir)
    try:
        for folder in (log_dir, jobs_dir):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                hint = "check the path and its permissions"
                raise BackendError(f"cannot create {folder}: {exc.strerror}", hint) from None
        return _submit_staged(prepared, run, cwd, jobs_dir, folders, export)
    except BaseException:
        for folder in reversed(created):  # a failed submit leaves no folder of its own behind
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty
        raise


def _submit_staged(
    prepared: Prepared, run: Runner, cwd: Path, jobs_dir: Path, folders: tuple[Path, Path], export: list[str]
) -> str:
    """Stage the job directory, sbatch, and move it into place under the job id; `folders` are
    the job's log and run directories, for its job.json."""
    spec = prepared.spec
    # A private staging folder: two submissions of one run name must not share it.
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.run_id}.", suffix=".submitting", dir=jobs_dir))
    try:
        script = staging / prepared.filename
        script.write_text(prepared.payload)
        (staging / "spec.yaml").write_text(yaml.safe_dump(msgspec.to_builtins(spec), sort_keys=False))
        # Without a workdir in the spec, the job runs where sbatch runs: make that cwd, which
        # relative log and checkpoint folders were resolved against above.
        chdir = [] if spec.workdir else [f"--chdir={cwd}"]
        proc = run(["sbatch", "--parsable", *chdir, *export, str(script)])
        if proc.returncode != 0:
            big = _too_big(spec, run) if TOO_BIG.search(proc.stderr) else None
            raise big or sbatch_error(proc.stderr, proc.returncode)
        job_id = parse_sbatch_job_id(proc.stdout)
        log_dir, run_dir = folders
        record = {
            "job_id": job_id,
            "run": spec.run_id,
            "log_dir": str(log_dir),
            "submitted_from": str(cwd),
            "launcher": spec.launcher,
            "nodes": spec.nodes,
            "procs_per_node": spec.procs,
            "run_dir": str(run_dir),
            "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        code = read(workdir_of(spec, cwd)) if spec.snapshot else None
        if code is not None:
            record["code"] = code
        (staging / "job.json").write_text(json.dumps(record, indent=2))
        _into_place(staging, job_dir_of(jobs_dir, spec, job_id))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return job_id


def folders_of(prepared: Prepared, cwd: Path) -> tuple[Path, Path]:
    """The job's log and run directories as this host sees them (relative ones below the folder
    the job runs in): what job.json and this machine's records keep."""
    spec = prepared.spec
    workdir = workdir_of(spec, cwd)
    log_dir = Path(expand_home(spec.log_dir))
    log_dir = log_dir if log_dir.is_absolute() else workdir / log_dir
    return log_dir, (prepared.run_dir or run_dir_of(spec, workdir)).path


def submitted(prepared: Prepared, job_id: str, cwd: Path, jobs_dir: Path) -> records.Submitted:
    """SlurmBackend.submitted: the job's run and log directories and its job directory (job.json,
    the script), so status, logs and the run directory are found from any folder of this machine."""
    log_dir, run_dir = folders_of(prepared, cwd)
    job_dir = job_dir_of(jobs_dir, prepared.spec, job_id)
    return records.Submitted("slurm", job_id, str(run_dir), str(log_dir), str(job_dir))


def job_dir_of(jobs_dir: Path, spec: JobSpec, job_id: str) -> Path:
    """The job's own folder: its script, spec and job.json."""
    return jobs_dir / f"{spec.run_id}-{job_id}"


def _into_place(staging: Path, job_dir: Path) -> None:
    """The staged job directory under its job id. SLURM has taken the job by now, so a folder of
    that name left by an earlier job with the same id (ids start again when a cluster's state is
    reset) is kept beside it under another name, never a reason to lose this job's record."""
    if job_dir.exists():
        job_dir.rename(job_dir.with_name(f"{job_dir.name}.before-{time.strftime('%Y%m%dT%H%M%S')}"))
    staging.rename(job_dir)


def _too_big(spec: JobSpec, run: Runner) -> BackendError | None:
    """After a rejection: the limit the spec passes, with the cluster's numbers (sinfo)."""
    proc = run(["sinfo", "--noheader", "--Node", "--format", SINFO_FORMAT])
    return too_big(spec, proc.stdout) if proc.returncode == 0 else None


def workdir_of(spec: JobSpec, cwd: Path) -> Path:
    if not spec.workdir:
        return cwd
    workdir = Path(expand_home(spec.workdir))
    return workdir if workdir.is_absolute() else cwd / workdir


def _missing_dirs(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, outermost first."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing[::-1]
