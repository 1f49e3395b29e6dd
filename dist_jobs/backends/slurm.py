"""SLURM backend: sbatch/squeue/sacct/scancel through an injectable command runner.

`prepare()` renders; `submit()` writes a job directory (spec copy, the exact script, job.json)
and runs `sbatch --parsable` on those same bytes. Output parsing lives in the pure functions of
`slurm_output.py`, tested on real captured output.
"""

from __future__ import annotations

import getpass
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator

import yaml

from dist_jobs.backends.base import JobStatus, Prepared
from dist_jobs.backends.slurm_output import (SACCT_FIELDS, SQUEUE_FORMAT, parse_sacct, parse_sbatch_job_id,
                                             parse_squeue, sacct_job_state, sbatch_error)
from dist_jobs.errors import BackendError
from dist_jobs.render import render
from dist_jobs.spec import JobSpec

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
NOT_INSTALLED_HINT = ("run this on a SLURM login node, or bring up the local test cluster: "
                      "bash slurm/cluster/up.sh")


def run_command(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BackendError(f"SLURM is not installed here: `{argv[0]}` is not on PATH", NOT_INSTALLED_HINT) from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"`{' '.join(argv)}` did not answer within {timeout:.0f} s",
                           "is slurmctld up? try `sinfo` or `scontrol ping`") from None


class SlurmBackend:
    name = "slurm"

    def __init__(self, runner: Runner | None = None, jobs_dir: Path | None = None,
                 cwd: Path | None = None) -> None:
        self.run = runner or run_command
        self.cwd = cwd or Path.cwd()
        self.jobs_dir = jobs_dir or self.cwd / "dist-jobs-runs"

    def prepare(self, spec: JobSpec) -> Prepared:
        return Prepared("slurm", spec, render(spec, "slurm"), f"{spec.run_id}.sbatch")

    def submit(self, prepared: Prepared) -> str:
        spec = prepared.spec
        staging = self.jobs_dir / f".{spec.run_id}.submitting"
        staging.mkdir(parents=True, exist_ok=True)
        script = staging / prepared.filename
        script.write_text(prepared.payload)
        (staging / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        proc = self.run(["sbatch", "--parsable", str(script)])
        if proc.returncode != 0:
            raise sbatch_error(proc.stderr, proc.returncode)
        job_id = parse_sbatch_job_id(proc.stdout)
        workdir = Path(spec.workdir) if spec.workdir else self.cwd
        log_dir = Path(spec.log_dir) if Path(spec.log_dir).is_absolute() else workdir / spec.log_dir
        (staging / "job.json").write_text(json.dumps({
            "job_id": job_id, "run": spec.run_id, "log_dir": str(log_dir), "submitted_from": str(self.cwd),
            "launcher": spec.launcher, "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
        final = self.jobs_dir / f"{spec.run_id}-{job_id}"
        staging.rename(final)
        return job_id

    def status(self, job_id: str) -> JobStatus:
        proc = self.run(["squeue", "--noheader", "--jobs", job_id, "--format", SQUEUE_FORMAT])
        if proc.returncode == 0:
            jobs = [j for j in parse_squeue(proc.stdout) if j.job_id.split("_")[0] == job_id.split("_")[0]]
            if jobs:
                job = jobs[0]
                return JobStatus(job.job_id, job.name, job.state, job.reason,
                                 {"nodes": job.nodelist, "time_used": job.time_used, "restarts": str(job.restarts)})
        acct = self.run(["sacct", "--parsable2", "--noheader", "--duplicates", "--jobs", job_id,
                         "--format", SACCT_FIELDS])
        rows = parse_sacct(acct.stdout) if acct.returncode == 0 else []
        state = sacct_job_state(rows, job_id)
        if state is None:
            raise BackendError(f"SLURM knows no job {job_id}",
                               "check the id (`squeue --me`, `sacct -X`); finished jobs need accounting (sacct)")
        return JobStatus(state.job_id, state.name, state.state, f"exit {state.exit_code}",
                         {"nodes": state.nodelist, "elapsed": state.elapsed, "attempts": str(state.attempts)})

    def list(self) -> list[JobStatus]:
        proc = self.run(["squeue", "--noheader", "--user", getpass.getuser(), "--format", SQUEUE_FORMAT])
        if proc.returncode != 0:
            raise BackendError(f"squeue failed: {proc.stderr.strip()}", "is slurmctld up? try `sinfo`")
        return [JobStatus(j.job_id, j.name, j.state, j.reason, {"nodes": j.nodelist}) for j in parse_squeue(proc.stdout)]

    def cancel(self, job_id: str) -> None:
        proc = self.run(["scancel", job_id])
        if proc.returncode != 0 or "Invalid job id" in proc.stderr:
            raise BackendError(f"scancel {job_id} failed: {proc.stderr.strip() or proc.returncode}",
                               "check the job id with `dist-jobs list --backend slurm`")

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        log_dir, run = self._log_location(job_id)
        files = _attempt_files(log_dir, run, job_id, rank or 0)
        if not files and not follow:
            raise BackendError(f"no logs for job {job_id} rank {rank or 0} in {log_dir}",
                               "the job may not have started yet (`dist-jobs status`), or use --follow")
        yield from _stitch(files, lambda: _attempt_files(log_dir, run, job_id, rank or 0),
                           (lambda: not self.status(job_id).finished) if follow else (lambda: False))

    def _log_location(self, job_id: str) -> tuple[Path, str]:
        for meta in self.jobs_dir.glob(f"*-{job_id}/job.json"):
            data = json.loads(meta.read_text())
            return Path(data["log_dir"]), data["run"]
        proc = self.run(["scontrol", "show", "job", job_id])
        out = re.search(r"StdOut=(\S+)", proc.stdout) if proc.returncode == 0 else None
        name = re.search(r"JobName=(\S+)", proc.stdout) if proc.returncode == 0 else None
        if not out or not name:
            raise BackendError(f"cannot find the log folder of job {job_id}",
                               f"submit with dist-jobs (it records it in {self.jobs_dir}) or pass a live job id")
        return Path(out.group(1)).parent, name.group(1)


def _attempt_files(log_dir: Path, run: str, job_id: str, rank: int) -> list[Path]:
    pattern = re.compile(rf"{re.escape(run)}-{re.escape(job_id)}-attempt(\d+)-rank{rank}\.out$")
    found = [(int(m.group(1)), p) for p in log_dir.glob(f"*-{job_id}-attempt*-rank{rank}.out")
             if (m := pattern.search(p.name))]
    return [p for _, p in sorted(found)]


def _stitch(files: list[Path], refresh: Callable[[], list[Path]], running: Callable[[], bool]) -> Iterator[str]:
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
