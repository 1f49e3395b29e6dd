"""The local backend as a queue: `submit` starts a detached `dist-jobs run` in a new session.

Everything about the job lives in `<run dir>/local/` (the run dir is `<checkpoint_dir>/<run>`):
spec.yaml, the launcher's pid, output.log (every rank's output, prefixed `[rank N]`), and
exit_code once it ends. So any shell that can read the run directory can attach to the job:
its id IS the run directory. Cancel sends SIGTERM to the `dist-jobs run` process, which stops
its ranks the way Ctrl-C does (they checkpoint at the next step boundary).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dist_jobs.backends import records
from dist_jobs.backends.base import Backend, JobStatus, Prepared, PreparedSweep, SnapshotPlan, made, run_dir_of
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.backends.local.record import (
    CANCELLED,
    CODE,
    EXIT,
    FOLDER,
    LOG,
    PID,
    REFUSED,
    SPEC,
    Started,
    Tee,
    alive,
    claimed,
    launcher_pid,
    read_int,
    run_recorded,
    write,
)
from dist_jobs.backends.snapshot import describe, plan, read, take
from dist_jobs.errors import BackendError, UsageError
from dist_jobs.rundir.ledger import ledger
from dist_jobs.rundir.lock import LOCK_NAME, LockHeld, current, stale_seconds
from dist_jobs.rundir.place import RunDir
from dist_jobs.rundir.verdict import Action, Verdict, recorded

# status, logs and cancel load neither the spec classes (msgspec, yaml) nor the renderer, as on
# SLURM (tests/unit/test_imports.py): the launcher and the spec's serialisation are imported where used.
if TYPE_CHECKING:
    from dist_jobs.backends.preflight import MissingPackages
    from dist_jobs.spec import JobSpec


class LocalBackend(Backend):
    """The local backend's queue verbs; prepare and the foreground run are LocalRunner's."""

    name = "local"
    summary = "detached processes"
    handle_id = "/RUN/DIR"  # local:///RUN/DIR: the id is the run directory's absolute path
    renders = False  # its payload is a plan of processes, not a file to submit
    runs_here = True
    sweep_summary = "K trials at a time under a detached driver"

    def __init__(
        self,
        out: TextIO | None = None,
        workdir: Path | None = None,
        missing: MissingPackages | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`missing`: which packages the ranks' python (this one) cannot import (default: looked
        up; tests replace it); `clock`: the time a snapshot's folder is named for."""
        self.out = out
        self.workdir = workdir or Path.cwd()
        self.missing = missing
        self.clock = clock

    def prepare(self, spec: JobSpec) -> Prepared:
        from dist_jobs.backends.local.runner import LocalRunner  # the renderer's helpers, msgspec

        return LocalRunner(self.out, self.workdir, clock=self.clock).prepare(spec)

    def foreground(self, spec: JobSpec, record: Path | None = None) -> int:
        """In the foreground, this process the run's launcher. `record`: the folder of the
        detached run `submit` started. Without one, the run records itself there as a submit does
        (this process's pid, the spec, the output as printed, the exit code), so `status`, `logs`,
        `wait` and `cancel` take its handle from another shell."""
        from dist_jobs.backends.local.runner import LocalRunner  # the renderer's helpers, msgspec

        if record is not None:
            return run_recorded(spec, record, LocalRunner())
        given = {} if self.missing is None else {"missing": self.missing}
        runner = LocalRunner(self.out, self.workdir, clock=self.clock, **given)
        folder = self._claim(spec, lambda folder: self._here(spec, folder))
        records.record(_submitted(folder.parent))  # as schedule() records a detached run
        with (folder / LOG).open("w", encoding="utf-8") as log:
            runner.out = Tee(runner.out, log)
            return run_recorded(spec, folder, runner)

    def hand_over(self, prepared: Prepared) -> Handle:
        # submit's alone: status, logs and cancel load no spec classes (msgspec)
        from dist_jobs.backends.preflight import check_trainer_packages, missing_packages

        spec = prepared.spec
        check_trainer_packages(spec, sys.executable, self.missing or missing_packages)  # the ranks run this python
        folder = self._claim(spec, lambda folder: self._start(spec, prepared.snapshot, folder), prepared.run_dir)
        return self.handle(str(folder.parent))

    def _claim(self, spec: JobSpec, start: Callable[[Path], None], run_dir: RunDir | None = None) -> Path:
        """The run's record folder, claimed by this process while `start` starts the run there
        (refused while another launcher runs it, or a live process here holds its run directory),
        and the run added to the records of this machine's jobs."""
        folder = made(run_dir or run_dir_of(spec, self.workdir), spec).path.resolve() / FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        with claimed(folder, spec.run_id):
            if alive(folder):  # a submitted or foreground run's launcher
                handle = f"local://{folder.parent}"
                raise UsageError(
                    f"run {spec.run_id} is already running here ({handle}, launcher pid {launcher_pid(folder)})",
                    f"wait for it (dist-jobs wait {handle}), cancel it (dist-jobs cancel {handle}), "
                    "or pick another --name",
                )
            _refuse_a_held_run_dir(folder.parent)  # another process here holds it (a hand-launched trainer)
            start(folder)
        return folder

    def submitted(self, prepared: Prepared, handle: Handle) -> records.Submitted:
        """The run directory is the job (its id): `list` finds it wherever checkpoint_dir put it."""
        return _submitted(Path(handle.job_id))

    def _begin(self, spec: JobSpec, code: SnapshotPlan | None, folder: Path) -> None:
        """A new record in `folder`: the last run's end cleared, the spec (and the copy of the
        code `code` plans, made here) written; the launcher's pid follows."""
        import msgspec  # submit's and run's alone: status, logs and cancel load no msgspec or yaml
        import yaml

        if code is not None:  # first: a refused one leaves the last job's record
            take(code)
        for stale in (EXIT, CANCELLED, PID, REFUSED, CODE):
            (folder / stale).unlink(missing_ok=True)
        if spec.snapshot:  # its record (commit, uncommitted changes), for status
            write(folder / CODE, json.dumps(read(Path(spec.workdir or ""))))
        (folder / SPEC).write_text(yaml.safe_dump(msgspec.to_builtins(spec), sort_keys=False))

    def _here(self, spec: JobSpec, folder: Path) -> None:
        """The record of a run whose launcher is this process (`dist-jobs run`)."""
        self._begin(spec, None, folder)
        Started.of(os.getpid()).write(folder / PID)

    def _start(self, spec: JobSpec, code: SnapshotPlan | None, folder: Path) -> None:
        """The detached launcher of a run whose record this process has claimed, from the copy of
        the code `code` plans (made here) where it has one."""
        self._begin(spec, code, folder)
        argv = [sys.executable, "-m", "dist_jobs", "run", "--record", str(folder), str(folder / SPEC)]
        with (folder / LOG).open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a closed terminal or Ctrl-C in this shell must not reach it
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        Started.of(proc.pid).write(folder / PID)  # its start time is set at fork, the exec may still be under way
        # Reap it if this process outlives it (a notebook): no zombie that looks alive.
        threading.Thread(target=proc.wait, daemon=True).start()

    def handle(self, job_id: str) -> Handle:
        """A local job's id is its run directory: the handle names it absolutely."""
        return Handle("local", str(Path(job_id).resolve()))

    @classmethod
    def parse_handle(cls, job_id: str, fields: dict[str, str]) -> Handle:
        """The run directory, an absolute path."""
        if not job_id.startswith("/"):
            raise ValueError(f"{job_id!r} is no absolute path")
        return super().parse_handle(str(Path(job_id)), fields)

    def log_ranks(self, spec: JobSpec) -> list[int] | None:
        """output.log holds every rank's lines."""
        return None

    def run_dir(self, job_id: str) -> Path:
        return Path(job_id)

    def owner(self, job_id: str) -> str | None:
        return None  # the run directory is the job: whoever wrote its progress is it

    def status(self, job_id: str) -> JobStatus:
        folder = _folder(job_id)
        return _with_goodput(_with_code(self._status(job_id), folder), folder)

    def _status(self, job_id: str) -> JobStatus:
        folder = _folder(job_id)
        name = folder.parent.name
        code = read_int(folder / EXIT)
        if code is None and alive(folder):
            if (folder / CANCELLED).exists():  # SIGTERM sent: the ranks checkpoint and stop, which takes a while
                # COMPLETING, as SLURM says of a job scancel has ended and whose processes are going
                return JobStatus(job_id, name, "COMPLETING", f"stopping: cancelled, pid {launcher_pid(folder)}")
            return JobStatus(job_id, name, "RUNNING", f"pid {launcher_pid(folder)}")
        if code is None:  # read again: the launcher may have written it and left since the first read
            code = read_int(folder / EXIT)
        if code is None:
            return JobStatus(job_id, name, "FAILED", f"the launcher died without an exit code; see {folder / LOG}")
        return _ended(job_id, name, code, folder)

    def list(self) -> list[JobStatus]:
        """Every job submitted from this machine (backends.records) whose run directory still holds it."""
        runs = dict.fromkeys(job.job_id for job in records.every("local"))
        found = [self.status(run) for run in runs if (Path(run) / FOLDER / SPEC).is_file()]
        return [dataclasses.replace(s, handle=str(self.handle(s.job_id))) for s in found]

    def exists(self, job_id: str) -> bool:
        """Whether its launcher still runs."""
        return alive(_folder(job_id))

    def stop(self, job_id: str) -> None:
        """SIGTERM to the launcher, which stops its ranks as Ctrl-C does."""
        folder = _folder(job_id)
        write(folder / CANCELLED, time.strftime("%Y-%m-%dT%H:%M:%S"))
        pid = launcher_pid(folder)
        assert pid is not None  # _alive read it
        os.kill(pid, signal.SIGTERM)

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Every rank's lines, each `[rank N] ...` (rank None), or rank `rank`'s as it wrote them,
        from output.log; follow: until it ends."""
        folder = _folder(job_id)
        prefixes = _prefixes(folder, rank)
        offset = 0
        while True:
            running = follow and alive(folder)  # asked before reading: no line written before the end is lost
            # newline="\n": a line ends at "\n" alone, as the launcher wrote it behind its prefix;
            # universal newlines would cut a program's "\r" redraws into lines without a prefix.
            with (folder / LOG).open("r", errors="replace", newline="\n") as fh:
                fh.seek(offset)
                for line in fh:
                    if prefixes is None:
                        yield _as_shown(line.rstrip("\n"), _prefix(line))
                    elif line.startswith(prefixes):
                        yield _as_shown(_unprefixed(line.rstrip("\n"), prefixes), "")
                offset = fh.tell()
            if not running:
                return
            time.sleep(0.5)

    # A sweep: every trial from one snapshot of the code; K at a time under a detached driver
    # (backends.local.sweep) when --max-parallel holds some back.

    def snapshot(self, spec: JobSpec) -> JobSpec:
        """One copy for every trial, beside their run directories (a driver starts some later)."""
        snapped, code = plan(
            spec, self.workdir, run_dir_of(spec, self.workdir).root.resolve() / spec.name, self.clock()
        )
        take(code)
        return snapped

    def sweep_roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        root = run_dir_of(first, here).root  # the trials' run directories are below it
        return root, str(root)

    def schedule_sweep(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path) -> builtins.list[str]:
        if not plan.max_parallel or plan.max_parallel >= len(plan.specs):
            return super().schedule_sweep(plan, manifest, root)
        from dist_jobs.backends.local.sweep import submit_driven  # a sweep's alone (as above)

        return submit_driven(plan, manifest, root, self, self.workdir)

    def cancel_sweep(self, folder: Path, handles: builtins.list[str]) -> builtins.list[str] | None:
        """No trial starts any more; those running are cancelled one by one."""
        from dist_jobs.backends.local.sweep import stop_driver  # a sweep's alone (as above)

        stop_driver(folder)
        return None

    def trial_not_started(self, run_dir: str) -> bool:
        return not (Path(run_dir) / FOLDER / PID).exists()


def _with_code(status: JobStatus, folder: Path) -> JobStatus:
    """`code`: the snapshot the job runs (commit, uncommitted changes), as SLURM's status has it."""
    try:
        record = json.loads((folder / CODE).read_text())
    except (OSError, ValueError):
        return status
    if not isinstance(record, dict):
        return status
    return dataclasses.replace(status, extra={**status.extra, "code": describe(record)})


def _with_goodput(status: JobStatus, folder: Path) -> JobStatus:
    """The run's goodput ledger: this submission's (the launcher's pid names its verdicts), from
    when it was submitted (the pid file is written then) until it ended, or now."""
    pid = launcher_pid(folder)
    try:
        submitted = (folder / PID).stat().st_mtime
    except OSError:
        return status
    found = ledger(folder.parent, str(pid), submitted, time.time())
    return dataclasses.replace(status, goodput=found) if found is not None else status


def _prefix(line: str) -> str:
    """The launcher's `[rank N] ` (or `[node N] `) in front of `line`, "" where there is none."""
    end = line.find("] ")
    return line[: end + 2] if line.startswith("[") and end > 0 and "\r" not in line[:end] else ""


def _as_shown(line: str, prefix: str) -> str:
    """`line` as a terminal would leave it: a program that redraws a line with "\r" (a progress
    bar) leaves its last state; `prefix` stays in front."""
    text = line[len(prefix) :].rstrip("\r")
    return prefix + text.rsplit("\r", 1)[-1] if "\r" in text else line.rstrip("\r")


def _unprefixed(line: str, prefixes: tuple[str, ...]) -> str:
    """A rank's line as it wrote it: without the launcher's prefix (and torchrun's `:` after it)."""
    rest = line[len(next(p for p in prefixes if line.startswith(p))) :]
    return rest[1:] if rest.startswith(":") else rest


def _prefixes(folder: Path, rank: int | None) -> tuple[str, ...] | None:
    if rank is None:
        return None
    import yaml  # logs of one rank alone: status and cancel load no yaml

    data = yaml.safe_load((folder / SPEC).read_text()) or {}
    if data.get("launcher") == "torchrun":  # one torchrun per node: its workers' lines carry [defaultN]
        procs = data.get("procs_per_node") or data.get("gpus_per_node") or 1
        return (f"[node {rank // procs}] [default{rank % procs}]",)
    return (f"[rank {rank}] ",)


def _refuse_a_held_run_dir(run_dir: Path) -> None:
    """Refuse, before anything is written, a run whose directory a live process on this machine
    holds (a foreground `dist-jobs run`): its launcher would only be refused the lock."""
    holder = current(run_dir / LOCK_NAME)
    if holder is not None and holder.on_this_machine() and not holder.gone():
        raise LockHeld(run_dir / LOCK_NAME, holder, 0.0, stale_seconds())


# What the local launcher's last verdict (dist_jobs.rundir.verdict) left the run as, in the words
# SLURM uses for the same end; a verdict that would go on (a restart) ended the run only when
# the launcher lost its lock meanwhile.
_ENDED_AS = {Action.DONE: "COMPLETED", Action.REQUEUE: "PREEMPTED", Action.NONE: "CANCELLED"}


def _ended(job_id: str, name: str, code: int, folder: Path) -> JobStatus:
    """An ended run, as its launcher's verdict says; as the lock's refusal says when the launcher
    refused to start it; by its exit code alone where no verdict is recorded (a launcher killed
    outright, or one that lost its lock: that one writes nothing more into the run directory)."""
    with contextlib.suppress(OSError):
        return JobStatus(job_id, name, "FAILED", f"{(folder / REFUSED).read_text().strip()} ({describe_exit(code)})")
    verdict = _last_verdict(folder, code)
    if (folder / CANCELLED).exists() and code != 0:
        return JobStatus(job_id, name, "CANCELLED", verdict.in_status() if verdict else describe_exit(code))
    if verdict is None:
        return JobStatus(job_id, name, "COMPLETED" if code == 0 else "FAILED", describe_exit(code))
    ranks = {verdict.rank: verdict.failure} if verdict.rank is not None and verdict.failure else {}
    return JobStatus(job_id, name, _ENDED_AS.get(verdict.action, "FAILED"), verdict.in_status(), ranks=ranks)


def _last_verdict(folder: Path, code: int) -> Verdict | None:
    """The verdict the launcher of this submission (its pid names them) ended with, exit `code`;
    None if it left none (one that lost its lock records no more: its last verdict is not its end)."""
    try:
        submitted = (folder / PID).stat().st_mtime
    except OSError:
        return None
    found = [v for v in recorded(folder.parent, str(launcher_pid(folder))) if v.time >= submitted]
    last = max(found, key=lambda v: v.time, default=None)
    return last if last is not None and last.exit_code == code else None


def _submitted(run_dir: Path) -> records.Submitted:
    """A local run as this machine's records keep it: its run directory is its id, and the
    launcher's folder in it is its job folder."""
    return records.Submitted("local", str(run_dir), str(run_dir), str(run_dir / FOLDER))


def _folder(job_id: str) -> Path:
    folder = Path(job_id) / FOLDER
    if not (folder / PID).exists():
        raise BackendError(
            f"no local job in {job_id} (no {FOLDER}/{PID} there)",
            "a local job's id is its run directory, <checkpoint_dir>/<run>, as `dist-jobs submit` printed it",
        )
    return folder
