"""The run's `local/` folder (`<run dir>/local/`): the record a launched run keeps, so that any
shell that reads the run directory can ask about it. A detached run (`submit`) and a foreground
one (`run`) keep the same record: the launcher's pid, the spec, every rank's output, why a run
was refused, and the exit code once it ended. How it ended is the verdict's to say
(dist_jobs.rundir.verdict, recorded in the run directory under the launcher's pid).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dist_jobs.errors import DistJobsError, UsageError
from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.rundir.holder import process_start, running

if TYPE_CHECKING:
    from dist_jobs.backends.local.runner import LocalRunner
    from dist_jobs.spec import JobSpec

FOLDER = "local"  # below the run directory
PID, LOG, EXIT, CANCELLED, SPEC = "pid", "output.log", "exit_code", "cancelled", "spec.yaml"
CODE = "code.json"  # the snapshot the job runs from (dist_jobs.backends.snapshot), if submitted with one
CLAIM = "submitting"  # locked by the process submitting the run now (dist-jobs submit), its pid inside
REFUSED = "refused"  # why the launcher refused to start the run (the lock's refusal): its error's sentence


def run_recorded(spec: JobSpec, folder: Path, runner: LocalRunner) -> int:
    """Run `spec` with `runner` in this process, its end recorded in `folder`; SIGTERM (cancel)
    stops it as Ctrl-C does."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    code = 130
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        code = runner.run(spec)
    except DistJobsError as exc:  # refused before any rank started (the run directory's lock): say why
        code = exc.exit_code
        write(folder / REFUSED, exc.message)  # before EXIT: a status that sees the code sees this too
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        write(folder / EXIT, str(code))
    return code


class Tee:
    """What a foreground run prints, on the terminal and into its record's output.log (which
    `dist-jobs logs` reads, as for a detached run)."""

    def __init__(self, shown: TextIO, log: TextIO) -> None:
        self.shown, self.log = shown, log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()  # `logs --follow` from another shell sees each line as it comes
        return self.shown.write(text)

    def flush(self) -> None:
        self.shown.flush()


@contextlib.contextmanager
def claimed(folder: Path, run: str) -> Iterator[None]:
    """This process alone submits the run until the new launcher's pid is recorded: two submits
    at once would both find no live launcher, and the refused one's launcher would then write
    its exit code into the live run's record. The claim is a kernel lock on the file (flock),
    which ends with its process: a submitter that died leaves nothing to take over, and the
    file is never removed, so no submitter can remove another's claim. It holds the pid, for
    the refusal's words."""
    with open(folder / CLAIM, "a+", encoding="ascii") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise UsageError(
                f"run {run} is being submitted here by process {holder} (local://{folder.parent})",
                "wait for that submit to finish, or pick another --name",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()  # before the lock goes with the file's closing


@dataclass(frozen=True)
class Started:
    """A detached process this machine started (a run's launcher, a sweep's driver), as its pid
    file records it: the pid and the process's start time, which tell it from a later process
    given the same pid. Asked by pid and start time, never by its command line: that reads
    empty while the process is still being exec'd, and while it waits to be reaped."""

    pid: int
    start: int | None  # rundir.holder.process_start; None where unknown (no /proc)

    @classmethod
    def of(cls, pid: int) -> Started:
        return cls(pid, process_start(pid))

    @classmethod
    def read(cls, path: Path) -> Started | None:
        try:
            words = path.read_text().split()
        except OSError:
            return None
        if not words or not words[0].isdigit():
            return None
        return cls(int(words[0]), int(words[1]) if len(words) > 1 and words[1].isdigit() else None)

    def write(self, path: Path) -> None:
        write(path, str(self.pid) if self.start is None else f"{self.pid} {self.start}")

    def running(self) -> bool:
        return running(self.pid, self.start)


def launcher_pid(folder: Path) -> int | None:
    """The pid of the run's launcher, as its record names it."""
    started = Started.read(folder / PID)
    return started.pid if started else None


def alive(folder: Path) -> bool:
    """Whether the run's launcher (the process recorded) still runs and has written no exit code."""
    started = Started.read(folder / PID)
    if started is None or read_int(folder / EXIT) is not None:
        return False
    return started.running()


def read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def write(path: Path, text: str) -> None:
    write_atomic(path, text + "\n")
