"""SLURM backend: sbatch/squeue/sacct/scancel through an injectable command runner.

`prepare()` renders; `submit()` writes a job directory (spec copy, the exact script, job.json)
and runs `sbatch --parsable` on those same bytes (slurm_submit.py). Output parsing lives in the
pure functions of `slurm_output.py`, tested on real captured output.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dist_jobs.backends.base import JobStatus, Prepared
from dist_jobs.backends.slurm_logs import attempt_files, stitch
from dist_jobs.backends.slurm_meta import array_task_key, job_meta
from dist_jobs.backends.slurm_output import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SQUEUE_FORMAT_LONG,
    SacctJobState,
    SlurmJob,
    cluster_name_in,
    conf_cluster_name,
    parse_sacct,
    parse_squeue,
    sacct_job_state,
)
from dist_jobs.errors import BackendError

if TYPE_CHECKING:
    from dist_jobs.spec import JobSpec

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
ARRAY_TASK_SACCT_TRIES = 15  # seconds: slurmdbd's lag after an array task ends
NOT_INSTALLED_HINT = "run this on a SLURM login node, or bring up the local test cluster: bash slurm/cluster/up.sh"


def run_command(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BackendError(f"SLURM is not installed here: `{argv[0]}` is not on PATH", NOT_INSTALLED_HINT) from None
    except subprocess.TimeoutExpired:
        raise BackendError(
            f"`{' '.join(argv)}` did not answer within {timeout:.0f} s",
            "is slurmctld up? try `sinfo` or `scontrol ping`",
        ) from None


class SlurmBackend:
    name = "slurm"

    def __init__(self, runner: Runner | None = None, jobs_dir: Path | None = None, cwd: Path | None = None) -> None:
        self.run = runner or run_command
        self.cwd = cwd or Path.cwd()
        self.jobs_dir = jobs_dir or self.cwd / "dist-jobs-runs"

    def prepare(self, spec: JobSpec) -> Prepared:
        from dist_jobs.render import render

        return Prepared("slurm", spec, render(spec, "slurm"), f"{spec.run_id}.sbatch")

    def submit(self, prepared: Prepared) -> str:
        from dist_jobs.backends.slurm_submit import submit  # the query verbs do without it

        return submit(prepared, self.run, self.cwd, self.jobs_dir)

    def run_dir(self, job_id: str) -> Path:
        """`<checkpoint_dir>/<run>` of a job submitted from here (recorded in its job.json)."""
        found = job_meta(self.jobs_dir, job_id).get("run_dir")
        if found:
            return Path(found)
        raise BackendError(
            f"job {job_id} has no job directory in {self.jobs_dir}, so its run directory is unknown",
            "attach from the folder you submitted from (or pass its --jobs-dir)",
        )

    def owner(self, job_id: str) -> str:
        """The job as its trainer names itself in progress.json (dist_jobs.train.live)."""
        return f"slurm:{job_id}"

    def cluster_name(self) -> str:
        """ClusterName from slurm.conf, for handles (slurm://<cluster>/<id>); 'default' if unknown."""
        if not hasattr(self, "_cluster"):
            # this host's slurm.conf first (unless a test's runner stands in): scontrol costs ~4 ms
            found = conf_cluster_name() if self.run is run_command else None
            if found is None:
                proc = self.run(["scontrol", "show", "config"])
                found = cluster_name_in(proc.stdout) if proc.returncode == 0 else None
            self._cluster = found or "default"
        return self._cluster

    def status(self, job_id: str) -> JobStatus:
        job = self._squeue_job(job_id)
        if job is not None and job.state == "COMPLETING":
            return self._completing(job_id, job)
        if job is not None:
            return JobStatus(
                job.job_id,
                job.name,
                job.state,
                "" if job.reason == "None" else job.reason,  # squeue's word for "no reason"
                {"nodes": job.nodelist, "time_used": job.time_used, "restarts": str(job.restarts)},
            )
        from dist_jobs.backends.slurm_batchlog import finished_status  # an ended job's alone
        from dist_jobs.rundir.attempts import starts

        state = self._sacct_state(job_id)
        meta = job_meta(self.jobs_dir, job_id)
        log = Path(meta.get("log_dir", "")) / meta.get("batch_log", "")
        text = log.read_text(errors="replace") if meta and log.is_file() else ""
        from dist_jobs.rundir.hang import read_hang

        # the batch script counts its starts under SLURM_JOB_ID: an array task's own (raw) id
        started = starts(Path(meta["run_dir"]), state.job_id_raw or job_id) if meta.get("run_dir") else 0
        hang = read_hang(Path(meta["run_dir"])) if meta.get("run_dir") else None
        return finished_status(state, meta.get("run", ""), text, meta.get("launcher", "srun"), started, hang)

    def _completing(self, job_id: str, job: SlurmJob) -> JobStatus:
        """A job whose nodes are being cleaned up: requeued or ended (sacct), and which node
        holds it up (sinfo). Either answer may be missing: the status is still told."""
        from dist_jobs.backends.slurm_faults import SINFO_NODE_STATES, completing_status, parse_node_states

        try:
            acct: SacctJobState | None = self._sacct_state(job_id)
        except BackendError:
            acct = None
        nodes = {}
        if job.nodelist:
            proc = self.run(["sinfo", "--noheader", "--Node", "--nodes", job.nodelist, "--format", SINFO_NODE_STATES])
            nodes = parse_node_states(proc.stdout) if proc.returncode == 0 else {}
        return completing_status(job, acct, nodes)

    def _sacct_state(self, job_id: str) -> SacctJobState:
        """sacct's record of the job. An array task (ID_I) is looked up among its array's records
        (one that never started is in the array's `ID_[...]` one); squeue drops a task the moment
        it ends, before slurmdbd may have its record, so it is asked again for a while."""
        task = "_" in job_id
        for attempt in range(ARRAY_TASK_SACCT_TRIES if task else 1):
            time.sleep(1.0 if attempt else 0.0)
            query = job_id.split("_")[0] if task else job_id
            acct = self.run(
                ["sacct", "--parsable2", "--noheader", "--duplicates", "--jobs", query, "--format", SACCT_FIELDS]
            )
            if acct.returncode != 0:  # not knowing the job and failing to look it up are different answers
                raise BackendError(
                    f"squeue does not list job {job_id} and sacct failed: {acct.stderr.strip() or 'no message'}",
                    "check accounting (`sacct -X`, slurmdbd) and the controller (`scontrol ping`)",
                )
            rows = parse_sacct(acct.stdout)
            state = sacct_job_state(rows, array_task_key(rows, job_id) if task else job_id)
            if state is not None:
                return state
        raise BackendError(
            f"SLURM knows no job {job_id}",
            "check the id (`squeue --me`, `sacct -X`); finished jobs need accounting (sacct)",
        )

    def _squeue_job(self, job_id: str) -> SlurmJob | None:
        """The job as squeue sees it, None once squeue forgot it (MinJobAge after the end)."""
        # --Format (long): only it has the restart count, which says a requeued job came back.
        proc = self.run(["squeue", "--noheader", "--jobs", job_id, "--Format", SQUEUE_FORMAT_LONG])
        if proc.returncode != 0:
            from dist_jobs.backends.slurm_sbatch import CONTROLLER_HINT, CONTROLLER_UNREACHABLE

            if re.search(CONTROLLER_UNREACHABLE, proc.stderr, re.IGNORECASE):
                said = proc.stderr.strip()
                raise BackendError(f"squeue cannot reach the SLURM controller (slurmctld): {said}", CONTROLLER_HINT)
            return None
        # An array job's id also names its tasks (123_4, 123_[5-9]): take the first one listed.
        jobs = [
            j for j in parse_squeue(proc.stdout, SQUEUE_FORMAT_LONG) if j.job_id.split("_")[0] == job_id.split("_")[0]
        ]
        return jobs[0] if jobs else None

    def list(self) -> list[JobStatus]:
        # the uid, which squeue takes as well as a name: exact, and no getpass import (termios)
        proc = self.run(["squeue", "--noheader", "--user", str(os.getuid()), "--format", SQUEUE_FORMAT])
        if proc.returncode != 0:
            raise BackendError(f"squeue failed: {proc.stderr.strip()}", "is slurmctld up? try `sinfo`")
        return [
            JobStatus(j.job_id, j.name, j.state, "" if j.reason == "None" else j.reason, {"nodes": j.nodelist})
            for j in parse_squeue(proc.stdout)
        ]

    def cancel(self, job_id: str) -> None:
        # Without --verbose, 22.05's scancel says nothing and exits 0 for an unknown or ended job.
        proc = self.run(["scancel", "--verbose", job_id])
        said = proc.stderr.strip()
        if "Invalid job id" in said:
            raise BackendError(
                f"SLURM knows no job {job_id} (or it ended a while ago): nothing to cancel",
                "check the id with `dist-jobs list --backend slurm` or `sacct -X`",
            )
        if "already completing or completed" in said:
            raise BackendError(
                f"job {job_id} has already ended: nothing to cancel",
                f"see how it ended with `dist-jobs status --backend slurm {job_id}`",
            )
        if proc.returncode != 0:
            raise BackendError(
                f"scancel {job_id} failed (exit {proc.returncode}): {said or 'no message'}",
                "check the job id with `dist-jobs list --backend slurm`",
            )

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Rank `rank`'s output, attempt after attempt. In torchrun mode SLURM runs one task per
        node and its file holds all that node's ranks: rank R is in node R // procs_per_node's."""
        log_dir, run, procs = self._log_location(job_id)
        task = (rank or 0) // procs if procs else (rank or 0)
        files = attempt_files(log_dir, run, job_id, task)
        if not files and not follow:
            raise BackendError(
                f"no logs for job {job_id} rank {rank or 0} in {log_dir}",
                "the job may not have started yet (`dist-jobs status`), or use --follow",
            )
        yield from stitch(
            files,
            lambda: attempt_files(log_dir, run, job_id, task),
            (lambda: not self.status(job_id).finished) if follow else (lambda: False),
        )

    def _log_location(self, job_id: str) -> tuple[Path, str, int | None]:
        """(log folder, run name, processes per torchrun task or None for srun mode)."""
        data = job_meta(self.jobs_dir, job_id)
        if data:
            procs = data.get("procs_per_node") if data.get("launcher") == "torchrun" else None
            return Path(data["log_dir"]), data["run"], procs
        proc = self.run(["scontrol", "show", "job", job_id])
        out = re.search(r"StdOut=(\S+)", proc.stdout) if proc.returncode == 0 else None
        name = re.search(r"JobName=(\S+)", proc.stdout) if proc.returncode == 0 else None
        if not out or not name:
            raise BackendError(
                f"cannot find the log folder of job {job_id}",
                f"submit with dist-jobs (it records it in {self.jobs_dir}) or pass a live job id",
            )
        return Path(out.group(1)).parent, name.group(1), None
