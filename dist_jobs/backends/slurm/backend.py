"""SLURM backend: sbatch/squeue/sacct/scancel through an injectable command runner.

`prepare()` renders (with `snapshot`, for the copy of the code it plans); `submit()` makes that
copy, writes a job directory (spec copy, the exact script, job.json) and runs `sbatch --parsable`
on those same bytes (submit.py). Output parsing lives in the
pure functions of `output.py`, tested on real captured output.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.backends.base import Backend, JobStatus, Option, Prepared, PreparedSweep
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.slurm.flags import SPEC_FLAGS
from dist_jobs.backends.slurm.logs import attempt_files, log_location, rank_lines, ranks_logged, stitch, stitch_all
from dist_jobs.backends.slurm.meta import array_member, array_task_key, job_meta, record_trials, with_goodput
from dist_jobs.backends.slurm.sbatch import check_controller
from dist_jobs.backends.slurm.squeue_sacct import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SQUEUE_FORMAT_LONG,
    QueuedJob,
    SacctJobState,
    SacctRow,
    cluster_name_in,
    conf_cluster_name,
    parse_sacct,
    parse_squeue,
    sacct_job_state,
)
from dist_jobs.errors import BackendError, DistJobsError

if TYPE_CHECKING:  # the query verbs load no spec classes (msgspec, tests/unit/test_imports.py)
    from dist_jobs.backends import records
    from dist_jobs.backends.preflight import MissingPackages
    from dist_jobs.spec import JobSpec

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
ARRAY_TASK_SACCT_TRIES = 15  # seconds: slurmdbd's lag after an array task ends
# A job squeue has dropped (it does so the moment the job ends) that slurmdbd has no record of yet.
NOT_RECORDED_YET = "squeue no longer lists it and sacct has no record of it yet"
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


def _queued(job: QueuedJob) -> JobStatus:
    """A job squeue lists (pending, running)."""
    return JobStatus(
        job.job_id,
        job.name,
        job.state,
        "" if job.reason == "None" else job.reason,  # squeue's word for "no reason"
        {"nodes": job.nodelist, "time_used": job.time_used, "restarts": str(job.restarts)},
    )


class SlurmBackend(Backend):
    name = "slurm"
    summary = "sbatch script"
    options = (
        Option("--jobs-dir", "jobs_dir", "SLURM: where job directories go (default: ./dist-jobs-runs)", kind=Path),
    )
    spec_flags, spec_flags_title = SPEC_FLAGS, "SLURM flags"
    handle_fields = ("cluster",)
    sweep_summary = "one job array (--max-parallel K: its %K)"

    def __init__(
        self,
        runner: Runner | None = None,
        jobs_dir: Path | None = None,
        cwd: Path | None = None,
        cluster: str = "",
        *,
        python: str | None = None,
        missing_packages: MissingPackages | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`python`: the job's python unless the spec names one (default: DIST_JOBS_PYTHON, else
        the interpreter running this); `missing_packages`: which of some packages that interpreter
        cannot import (default: looked up in this one; see backends.preflight); `clock`: a snapshot's time."""
        self.run = runner or run_command
        self.cwd = cwd or Path.cwd()
        self.jobs_dir = jobs_dir or self.cwd / "dist-jobs-runs"
        self._cluster = cluster  # from a handle; else asked once, when a handle is made
        self.python = python or os.environ.get("DIST_JOBS_PYTHON") or sys.executable
        self.missing_packages = missing_packages
        self.clock = clock

    def prepare(self, spec: JobSpec) -> Prepared:
        from dist_jobs.backends.slurm.submit import prepare  # jinja2, yaml, msgspec: the query verbs load none

        return prepare(spec, self.cwd, self.jobs_dir, self.clock())

    def render(self, spec: JobSpec) -> str:
        """The script for `spec` as it is: submitted by hand, no copy of the code is made."""
        from dist_jobs.render import render  # the renderer: render's alone (as above)

        return render(spec, "slurm")

    def hand_over(self, prepared: Prepared) -> Handle:
        # submit's own modules: yaml and msgspec, which the query verbs load none of (test_imports)
        from dist_jobs.backends.preflight import missing_packages
        from dist_jobs.backends.slurm.submit import job_python_export, submit

        export = job_python_export(prepared.spec, self.python, self.missing_packages or missing_packages)
        return self.handle(submit(prepared, self.run, self.cwd, self.jobs_dir, export))

    def submitted(self, prepared: Prepared, handle: Handle) -> records.Submitted:
        from dist_jobs.backends.slurm.submit import submitted  # submit's alone (as above)

        return submitted(prepared, handle.job_id, self.cwd, self.jobs_dir)

    def handle(self, job_id: str) -> Handle:
        return Handle("slurm", job_id, cluster=self.cluster_name())

    @classmethod
    def parse_handle(cls, job_id: str, fields: dict[str, str]) -> Handle:
        """A job id is digits, an array task's `<array>_<task>`."""
        if not job_id.replace("_", "").isdigit():
            raise ValueError(f"{job_id!r} is no SLURM job id")
        return super().parse_handle(job_id, fields)

    def log_ranks(self, spec: JobSpec) -> list[int] | None:
        """srun: one file per rank; torchrun: one per node, holding its ranks (the node's first names it)."""
        if spec.launcher == "torchrun":
            return [node * spec.procs for node in range(spec.nodes)]
        return list(range(spec.world_size))

    def run_dir(self, job_id: str) -> Path:
        """`<checkpoint_dir>/<run>` of a job submitted from this machine (its job.json, found
        through backends.records from any folder)."""
        found = job_meta(self.jobs_dir, job_id).get("run_dir")
        if found:
            return Path(found)
        raise BackendError(
            f"job {job_id} has no job directory in {self.jobs_dir}, so its run directory is unknown",
            "a job submitted from this machine is found from any folder; for another machine's, pass its --jobs-dir",
        )

    def owner(self, job_id: str) -> str:
        """The job as its trainer names itself in progress.json (dist_jobs.train.live)."""
        return f"slurm:{job_id}"

    def cluster_name(self) -> str:
        """ClusterName from slurm.conf, for handles (slurm://<cluster>/<id>); 'default' if unknown."""
        if not self._cluster:
            # this host's slurm.conf first (unless a test's runner stands in): scontrol costs ~4 ms
            found = conf_cluster_name() if self.run is run_command else None
            if found is None:
                proc = self.run(["scontrol", "show", "config"])
                found = cluster_name_in(proc.stdout) if proc.returncode == 0 else None
            self._cluster = found or "default"
        return self._cluster

    def status(self, job_id: str) -> JobStatus:
        return self._with_code(job_id, self._status(job_id))

    def _status(self, job_id: str) -> JobStatus:
        job = self._squeue_job(job_id)
        if job is not None and job.state == "COMPLETING":
            return self._completing(job_id, job)
        if job is not None:
            return _queued(job)
        acct = self._sacct_state(job_id)
        if acct is not None:
            return self._ended(job_id, acct)
        if job_meta(self.jobs_dir, job_id):  # submitted from here: it exists, slurmdbd lags
            return JobStatus(job_id, "", "UNKNOWN", NOT_RECORDED_YET)
        raise BackendError(
            f"SLURM knows no job {job_id}",
            "check the id (`squeue --me`, `sacct -X`); finished jobs need accounting (sacct)",
        )

    def _with_code(self, job_id: str, status: JobStatus) -> JobStatus:
        """`code`: the snapshot the job runs (commit, uncommitted changes), if it was submitted
        with one; the goodput ledger and the nodes kept away of a job submitted from here whose
        run directory is readable."""
        meta = job_meta(self.jobs_dir, job_id)
        if not status.finished and meta.get("run_dir"):
            # a job not ended's alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
            from dist_jobs.backends.slurm.joining import with_joining, with_quarantine

            status = with_quarantine(job_id, with_joining(self.run, job_id, status, meta), meta)
        status = with_goodput(job_id, status, meta)
        code = meta.get("code")
        if not isinstance(code, dict):
            return status
        # a job with a snapshot alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
        from dist_jobs.backends.snapshot import describe

        return dataclasses.replace(status, extra={**status.extra, "code": describe(code)})

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | DistJobsError]:
        """The status of each job in `job_ids`, from one `squeue` and one `sacct` for all of them
        (array tasks asked for by their array's id), however many there are. A job squeue has
        dropped that sacct does not list yet (an array task that just ended, before slurmdbd
        has its record) reads UNKNOWN: the next poll finds it."""
        listed = self._squeue_many(job_ids)
        queued = {j: listed[k] for j in job_ids if (k := array_member(listed, j)) in listed}
        rest = [j for j in job_ids if j not in queued or queued[j].state == "COMPLETING"]
        rows = self._sacct_rows(rest) if rest else []
        out: dict[str, JobStatus] = {}
        for job_id in job_ids:
            job = queued.get(job_id)
            acct = sacct_job_state(rows, array_task_key(rows, job_id) if "_" in job_id else job_id)
            if job is not None and job.state != "COMPLETING":
                out[job_id] = _queued(job)
            elif job is not None:
                out[job_id] = self._completing(job_id, job, acct)
            elif acct is not None:
                out[job_id] = self._ended(job_id, acct)
            else:
                out[job_id] = JobStatus(job_id, "", "UNKNOWN", NOT_RECORDED_YET)
        return {job_id: self._with_code(job_id, found) for job_id, found in out.items()}

    def _ended(self, job_id: str, state: SacctJobState) -> JobStatus:
        """A job squeue has forgotten: sacct's `state`, told with its batch log and run directory."""
        # an ended job's alone: list, cancel, logs and a running job's status do without them
        # (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
        from dist_jobs.backends.slurm.batchlog import finished_status
        from dist_jobs.rundir.attempts import starts
        from dist_jobs.rundir.hang import read_hang
        from dist_jobs.rundir.verdict import recorded

        meta = job_meta(self.jobs_dir, job_id)
        log = Path(meta.get("log_dir", "")) / meta.get("batch_log", "")
        text = log.read_text(errors="replace") if meta and log.is_file() else ""
        # the batch script counts its starts under SLURM_JOB_ID: an array task's own (raw) id
        started = starts(Path(meta["run_dir"]), state.job_id_raw or job_id) if meta.get("run_dir") else 0
        hang = read_hang(Path(meta["run_dir"])) if meta.get("run_dir") else None
        verdicts = recorded(Path(meta["run_dir"]), job_id) if meta.get("run_dir") else []
        return finished_status(state, meta.get("run", ""), text, meta.get("launcher", "srun"), started, hang, verdicts)

    def _squeue_many(self, job_ids: list[str]) -> dict[str, QueuedJob]:
        """One squeue for every job (an array task by its array's id): the jobs it lists, by id."""
        query = ",".join(dict.fromkeys(j.split("_")[0] for j in job_ids))
        proc = self.run(["squeue", "--noheader", "--jobs", query, "--Format", SQUEUE_FORMAT_LONG])
        if proc.returncode != 0:
            check_controller(proc.stderr)
            return {}  # one id that squeue no longer knows: it says "Invalid job id"
        return {j.job_id: j for j in parse_squeue(proc.stdout, SQUEUE_FORMAT_LONG)}

    def _sacct_rows(self, job_ids: list[str]) -> list[SacctRow]:
        """One sacct for every job (an array task by its array's id), each attempt's rows."""
        query = ",".join(dict.fromkeys(j.split("_")[0] for j in job_ids))
        acct = self.run(
            ["sacct", "--parsable2", "--noheader", "--duplicates", "--jobs", query, "--format", SACCT_FIELDS]
        )
        if acct.returncode != 0:
            raise BackendError(
                f"squeue does not list jobs {query} and sacct failed: {acct.stderr.strip() or 'no message'}",
                "check accounting (`sacct -X`, slurmdbd) and the controller (`scontrol ping`)",
            )
        return parse_sacct(acct.stdout)

    def _completing(self, job_id: str, job: QueuedJob, acct: SacctJobState | None = None) -> JobStatus:
        """A job whose nodes are being cleaned up: requeued or ended (sacct, unless `acct` is
        given), and which node holds it up (sinfo). Either answer may be missing: the status is
        still told."""
        # a completing job's alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
        from dist_jobs.backends.slurm.faults import SINFO_NODE_STATES, completing_status, parse_node_states

        if acct is None:
            try:
                acct = self._sacct_state(job_id)
            except BackendError:  # sacct failed: the status is told without it
                acct = None
        nodes = {}
        # the allocation's nodes too: a dead node SLURM has released is no longer in squeue's list
        allocated = acct.nodelist if acct is not None and acct.nodelist not in ("", "None assigned") else ""
        asked = allocated or job.nodelist
        if asked:
            proc = self.run(["sinfo", "--noheader", "--Node", "--nodes", asked, "--format", SINFO_NODE_STATES])
            nodes = parse_node_states(proc.stdout) if proc.returncode == 0 else {}
        return completing_status(job, acct, nodes)

    def _sacct_state(self, job_id: str) -> SacctJobState | None:
        """sacct's record of the job, None if it has none. An array task (ID_I) is looked up among
        its array's records (one that never started is in the array's `ID_[...]` one); squeue
        drops a task the moment it ends, before slurmdbd may have its record, so it is asked again
        for a while."""
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
        return None

    def _squeue_job(self, job_id: str) -> QueuedJob | None:
        """The job as squeue sees it, None once squeue forgot it (MinJobAge after the end)."""
        # --Format (long): only it has the restart count, which says a requeued job came back.
        proc = self.run(["squeue", "--noheader", "--jobs", job_id, "--Format", SQUEUE_FORMAT_LONG])
        if proc.returncode != 0:
            check_controller(proc.stderr)
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
            JobStatus(
                j.job_id,
                j.name,
                j.state,
                "" if j.reason == "None" else j.reason,
                {"nodes": j.nodelist},
                handle=str(self.handle(j.job_id)),
            )
            for j in parse_squeue(proc.stdout)
        ]

    def stop(self, job_id: str) -> None:
        """scancel, which itself says when there is no such job (exists() is not asked first)."""
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
        """Rank `rank`'s output as it wrote it, attempt after attempt; every rank's when None, each
        line `[rank N] ...`, as on the other backends. In torchrun mode SLURM runs one task per node and
        its file holds all that node's ranks: rank R is in node R // procs_per_node's, and every
        rank's output is told node by node (`[node N] ...`). There torchrun prefixes each line of
        its workers with `[rank R] ` (PET_LOG_LINE_PREFIX_TEMPLATE, dist_jobs.spec.env), so rank
        R's lines are found by that prefix (a node file without any, of an older job: all of it)."""
        log_dir, run, procs = log_location(self.jobs_dir, job_id, self.run)
        if rank is None:
            yield from self._all_logs(job_id, log_dir, run, "node" if procs else "rank", follow)
            return
        task = (rank or 0) // procs if procs else (rank or 0)
        files = attempt_files(log_dir, run, job_id, task)
        if not files and not follow:
            raise BackendError(
                f"no logs for job {job_id} rank {rank or 0} in {log_dir}",
                "the job may not have started yet (`dist-jobs status`), or use --follow",
            )
        lines = stitch(
            files,
            lambda: attempt_files(log_dir, run, job_id, task),
            (lambda: not self.status(job_id).finished) if follow else (lambda: False),
        )
        yield from (lines if not procs else rank_lines(lines, rank, follow))

    def _all_logs(self, job_id: str, log_dir: Path, run: str, label: str, follow: bool) -> Iterator[str]:
        def files() -> dict[int, list[Path]]:
            return {r: attempt_files(log_dir, run, job_id, r) for r in ranks_logged(log_dir, run, job_id)}

        if not files() and not follow:
            raise BackendError(
                f"no logs for job {job_id} in {log_dir}",
                "the job may not have started yet (`dist-jobs status`), or use --follow",
            )
        yield from stitch_all(files, (lambda: not self.status(job_id).finished) if follow else (lambda: False), label)

    # A sweep: one job array, its tasks running from one snapshot of the code.

    def snapshot(self, spec: JobSpec) -> JobSpec:
        from dist_jobs.backends.slurm.submit import snapshot  # submit's alone (as above)

        return snapshot(spec, self.cwd, self.jobs_dir, self.clock())

    def prepare_sweep(
        self, name: str, params: builtins.list[dict[str, Any]], specs: builtins.list[JobSpec], max_parallel: int | None
    ) -> PreparedSweep:
        from dist_jobs.backends.slurm.sweep import prepare_array  # a sweep's alone (test_imports)

        return prepare_array(name, params, specs, max_parallel)

    def schedule_sweep(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path) -> builtins.list[str]:
        assert plan.head is not None  # one sbatch of the array; trial i is its task i
        array = self.schedule(Prepared("slurm", plan.head, plan.payloads[0][1], plan.payloads[0][0]))
        record_trials(self.jobs_dir, array.job_id, [s.run_id for s in plan.specs])
        return [str(self.handle(f"{array.job_id}_{i}")) for i in range(len(plan.specs))]

    def cancel_sweep(self, folder: Path, handles: builtins.list[str]) -> builtins.list[str] | None:
        """The whole array, one scancel."""
        try:
            self.cancel(handles[0].rsplit("/", 1)[1].split("_")[0])
        except DistJobsError:
            return []  # it has ended already
        return handles

    @classmethod
    def attach_options(cls, saved: Mapping[str, str]) -> dict[str, Any]:
        return {k: Path(saved[k]) for k in ("jobs_dir", "cwd") if saved.get(k)}
