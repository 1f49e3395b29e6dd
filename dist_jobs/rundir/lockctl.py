"""`python3 -m dist_jobs.rundir.lockctl`: the run directory lock for shell scripts.

The sbatch script and the pod entrypoint take the lock for their whole job, so that a user's own
command is covered as well as the built-in trainer:

    token="$(python3 -m dist_jobs.rundir.lockctl acquire RUN_DIR --backend slurm --pid $$)" || exit 2
    python3 -m dist_jobs.rundir.lockctl heartbeat RUN_DIR "$token" --pid $$ --stop-steps "$SLURM_JOB_ID" &
    ... the job, with DIST_JOBS_LOCK_TOKEN="$token" exported so the trainer joins the lock ...
    python3 -m dist_jobs.rundir.lockctl release RUN_DIR "$token"

(The pod entrypoint cannot write `$$`, which Kubernetes turns into `$`: it makes the token itself,
passes `--token`, and relies on the default --pid, the parent, which is the shell when
lockctl runs as a plain command, not inside `$(...)`.)

`acquire` prints the token (unless --token gave it), or the refusal (exit 2); a holder that may
be alive is waited for (see dist_jobs.rundir.lock). `heartbeat` keeps the lock fresh until it is
released or taken over, or process --pid is gone; it ignores the signals that stop a job (TERM,
INT, HUP, USR1, USR2), since the ranks may still be writing their preemption checkpoint. When
another run took the lock over, the job must stop at once and write nothing more: `heartbeat`
kills what it was told to (--stop-steps: every step of that SLURM job, not its batch shell;
--kill-tree: a process and all its descendants) with SIGKILL, a signal a rank cannot turn into
a checkpoint, and exits 6; the steps are left alone when a newer attempt of the same job holds
the lock (they are that attempt's). A heartbeat that cannot reach LOCK past its lease, or that
fails in any other way, ends the same way. `check` exits 0 while the token holds the lock, else 6
naming the holder.

A pod other than rank 0 holds no lock, but its program writes into the run directory too (a
user's script saving its own shards): `follow` runs beside it, reads LOCK every heartbeat, and
stops it as the holder's heartbeat stops pod 0's (SIGKILL of the tree, exit 6) once another job
holds the run directory after this one did, or LOCK cannot be read past the lease. It ends with
the program.

    python3 -m dist_jobs.rundir.lockctl follow RUN_DIR --owner "$DIST_JOBS_LOCK_OWNER" --kill-tree PID &
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dist_jobs.constants import LOCK_LOST_EXIT_CODE
from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.holder import Holder, owner_from_env, process_start, stat_fields
from dist_jobs.rundir.lock import (
    LOCK_NAME,
    Fence,
    Lock,
    LockLost,
    acquire,
    current,
    heartbeat_seconds,
    lease_seconds,
    new_token,
    retrying,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m dist_jobs.rundir.lockctl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("acquire", help="take the lock (or refuse, exit 2); print its token")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--backend", default="shell", help="what holds it: slurm, k8s, ... (for messages)")
    p.add_argument("--pid", type=int, default=os.getppid(), help="the process that holds it (default: parent)")
    p.add_argument("--job-id", default=None, help="scheduler job id (default: $SLURM_JOB_ID, else the owner)")
    p.add_argument("--token", default=None, help="the lock's token, made by the caller (default: printed)")
    for verb in ("heartbeat", "release", "check"):
        p = sub.add_parser(verb, help=f"{verb} the lock taken with TOKEN")
        p.add_argument("run_dir", type=Path)
        p.add_argument("token")
        if verb == "heartbeat":
            p.add_argument("--pid", type=int, default=os.getppid(), help="stop when this process is gone")
            p.add_argument("--every", type=float, help="seconds (default: $DIST_JOBS_LOCK_HEARTBEAT_SECONDS or 10)")
            p.add_argument("--stop-steps", metavar="JOB_ID", help="lost: SIGKILL every step of this SLURM job")
            p.add_argument("--kill-tree", metavar="PID", type=int, help="lost: SIGKILL PID and its descendants")
    p = sub.add_parser("follow", help="a pod without the lock: stop PID's tree once another job holds it")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--owner", required=True, help="this job as LOCK names it ($DIST_JOBS_LOCK_OWNER)")
    p.add_argument("--kill-tree", metavar="PID", type=int, required=True, help="the program: stopped on loss")
    p.add_argument("--every", type=float, help="seconds (default: $DIST_JOBS_LOCK_HEARTBEAT_SECONDS or 10)")
    return parser


def _mine(run_dir: Path, token: str) -> Lock | None:
    """Our lock, or None once it names another holder (or none); a transient I/O error is
    retried for as long as a heartbeat would."""
    holder = retrying(lambda: current(run_dir / LOCK_NAME), time.monotonic() + lease_seconds())
    return Lock(run_dir / LOCK_NAME, holder, owned=True) if holder is not None and holder.token == token else None


def _acquire(args: argparse.Namespace) -> int:
    owner = owner_from_env(os.environ)
    job_id = args.job_id if args.job_id is not None else os.environ.get("SLURM_JOB_ID", "") or owner.split(":")[-1]
    me = Holder.this(args.token or new_token(), owner, args.backend, job_id, pid=args.pid)
    lock = acquire(args.run_dir, me, on_wait=lambda why: print(f"dist-jobs: {why}", file=sys.stderr, flush=True))
    if lock.took_over:
        print(f"dist-jobs: took over the lock of {args.run_dir}: {lock.took_over}", file=sys.stderr)
    if not args.token:
        print(lock.token)
    return 0


@dataclass
class _Ending:
    """How a heartbeat ended: lost (the job must stop) or not, who holds the lock now, the I/O
    error that outlasted the lease if that ended it, and our own record."""

    lost: bool
    successor: Holder | None = None
    failure: str = ""
    mine: Holder | None = None


def _ignore_stop_signals() -> None:
    """The signals that stop a job: the ranks checkpoint on them, so the lock's watch goes on."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)


def _heartbeat(args: argparse.Namespace) -> int:
    _ignore_stop_signals()
    try:
        end = _beat_until_lost(args)
    except Exception as exc:  # whatever ends the heartbeat ends the lease: the job must not outlive it
        end = _Ending(True, failure=f"the heartbeat failed: {exc!r}")
    if not end.lost:
        return 0
    if args.stop_steps and end.successor and end.mine and end.successor.later_attempt_of(end.mine):
        # A newer attempt of this job took over (this one's node dropped out of SLURM while its
        # processes lived on): the job's steps are that attempt's now. This attempt's ranks stop
        # at their next write into the run directory (their fence).
        print(f"dist-jobs: {end.successor.describe()} holds the lock now: leaving its steps alone", file=sys.stderr)
    elif args.stop_steps:
        _stop_slurm_steps(args.stop_steps)
    if args.kill_tree:
        _kill_tree(args.kill_tree)
    if end.failure:
        print(f"dist-jobs: run directory lock in {args.run_dir}: {end.failure}", file=sys.stderr, flush=True)
    print(f"dist-jobs: {LockLost(args.run_dir, end.successor, 'let this job go on')}", file=sys.stderr, flush=True)
    return LOCK_LOST_EXIT_CODE


def _beat_until_lost(args: argparse.Namespace) -> _Ending:
    """Beat until the job ends (nothing to stop) or the lock is lost."""
    lock = _mine(args.run_dir, args.token)
    if lock is None:  # lost before we began?
        successor = current(args.run_dir / LOCK_NAME)
        return _Ending(successor is not None or (args.run_dir / LOCK_NAME).exists(), successor)
    watched = process_start(args.pid)
    every = heartbeat_seconds() if args.every is None else args.every
    while lock.beat():
        time.sleep(every)
        if watched is None or process_start(args.pid) != watched:
            return _Ending(False)  # the job's shell is gone: the lock goes stale unless released
    if lock.successor is None and not lock.failure and not (args.run_dir / LOCK_NAME).exists():
        return _Ending(False)  # released (the job ended)
    return _Ending(True, lock.successor, lock.failure, lock.holder)


def _follow(args: argparse.Namespace) -> int:
    """Until the program --kill-tree ends: stop it once LOCK names another job, or cannot be read
    for a whole lease (this pod may be cut off from the volume: a newcomer may take over soon)."""
    _ignore_stop_signals()
    every = heartbeat_seconds() if args.every is None else args.every
    watched, held = process_start(args.kill_tree), False
    while watched is not None and process_start(args.kill_tree) == watched:
        try:
            holder = retrying(lambda: current(args.run_dir / LOCK_NAME), time.monotonic() + lease_seconds())
        except OSError as exc:
            failure = f"LOCK could not be read for a whole lease: {exc}"
            print(f"dist-jobs: run directory lock in {args.run_dir}: {failure}", file=sys.stderr, flush=True)
            return _stop_tree(args, None)
        # Only once this job has held it: before, pod 0 may still be waiting out a stale holder,
        # and a job that runs unlocked (an elastic one running a user's command) has nothing to lose.
        held = held or (holder is not None and holder.owner == args.owner)
        if held and holder is not None and holder.owner != args.owner:
            return _stop_tree(args, holder)
        time.sleep(every)
    return 0


def _stop_tree(args: argparse.Namespace, successor: Holder | None) -> int:
    # Said first: the entrypoint ends this process as soon as the program it kills has ended.
    print(f"dist-jobs: {LockLost(args.run_dir, successor, 'let this pod go on')}", file=sys.stderr, flush=True)
    _kill_tree(args.kill_tree)
    return LOCK_LOST_EXIT_CODE


def _stop_slurm_steps(job_id: str) -> None:
    """SIGKILL every step of the job but its batch shell, which decides what happens next."""
    argv = ["squeue", "--noheader", "--steps", "--jobs", job_id, "--format", "%i"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout.split()
        steps = [step for step in listed if re.fullmatch(rf"{re.escape(job_id)}\.\d+", step)]
        if steps:
            subprocess.run(["scancel", "--signal=KILL", *steps], timeout=30, check=False)


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (ranks under torchrun under a shell). The tree is
    stopped first, until it stops growing: a process killed while its child was being forked
    would leave that child to init, out of reach, and it would go on writing."""
    stopped: set[int] = set()
    while new := _descendants(pid) - stopped:
        for victim in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGSTOP)
        _wait_stopped(new)
        stopped |= new
    # `pid` last: its parent (the pod entrypoint) reaps it and then ends this heartbeat, which
    # must not happen while a stopped descendant is still to be killed (it would stay stopped
    # forever, holding the pod's pipes).
    for victim in [*(stopped - {pid}), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


def _wait_stopped(pids: set[int], limit: float = 5.0) -> None:
    """Until each of `pids` is stopped or gone. SIGSTOP is delivered when its target next runs: on
    a busy machine a process still running after the kill() can fork a child that the next scan
    of /proc misses, and that child would be left to init, holding the job's files and pipes."""
    deadline = time.monotonic() + limit
    for victim in pids:
        # the state letter: T/t stopped, Z/X dead, nothing once gone
        while (stat_fields(victim) or ["X"])[0] not in "TtZX" and time.monotonic() < deadline:
            time.sleep(0.001)


def _descendants(pid: int) -> set[int]:
    """`pid` and every process below it now, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(ValueError, IndexError):
                children.setdefault(int(stat_fields(entry)[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        current_pid = todo.pop()
        found.add(current_pid)
        todo.extend(children.get(current_pid, []))
    return found


def _check(args: argparse.Namespace) -> int:
    Fence(args.run_dir / LOCK_NAME, args.token).check("let this job go on")
    return 0


def _release(args: argparse.Namespace) -> int:
    lock = _mine(args.run_dir, args.token)
    if lock is not None:
        lock.release()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        verbs = {"acquire": _acquire, "heartbeat": _heartbeat, "release": _release, "check": _check, "follow": _follow}
        return verbs[args.verb](args)
    except DistJobsError as exc:
        print(f"dist-jobs: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"dist-jobs: run directory lock in {args.run_dir}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
