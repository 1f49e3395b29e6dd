"""`python3 -m dist_jobs.rundir.lockctl`: the run directory lock for shell scripts.

The sbatch script and the pod entrypoint take the lock for their whole job, so that a user's own
command is covered as well as the built-in trainer:

    token="$(python3 -m dist_jobs.rundir.lockctl acquire RUN_DIR --backend slurm --pid $$)" || exit 2
    python3 -m dist_jobs.rundir.lockctl heartbeat RUN_DIR "$token" --pid $$ &
    ... the job, with DIST_JOBS_LOCK_TOKEN="$token" exported so the trainer joins the lock ...
    python3 -m dist_jobs.rundir.lockctl release RUN_DIR "$token"

(The pod entrypoint cannot write `$$`, which Kubernetes turns into `$`: it makes the token itself,
passes `--token`, and relies on the default --pid, the parent, which is the shell when
lockctl runs as a plain command, not inside `$(...)`.)

`acquire` prints the token (unless --token gave it), or the refusal (exit 2). `heartbeat` keeps the lock fresh until it
is released or taken over, or process --pid is gone; it ignores the signals that stop a job
(TERM, INT, HUP, USR1, USR2), since the ranks may still be writing their preemption checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.holder import Holder, owner_from_env, process_start
from dist_jobs.rundir.lock import LOCK_NAME, Lock, acquire, heartbeat_seconds, new_token


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m dist_jobs.rundir.lockctl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("acquire", help="take the lock (or refuse, exit 2); print its token")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--backend", default="shell", help="what holds it: slurm, k8s, ... (for messages)")
    p.add_argument("--pid", type=int, default=os.getppid(), help="the process that holds it (default: parent)")
    p.add_argument("--job-id", default=None, help="scheduler job id (default: $SLURM_JOB_ID, else the owner)")
    p.add_argument("--token", default=None, help="the lock's token, made by the caller (default: printed)")
    for verb in ("heartbeat", "release"):
        p = sub.add_parser(verb, help=f"{verb} the lock taken with TOKEN")
        p.add_argument("run_dir", type=Path)
        p.add_argument("token")
        if verb == "heartbeat":
            p.add_argument("--pid", type=int, default=os.getppid(), help="stop when this process is gone")
            p.add_argument("--every", type=float, help="seconds (default: $DIST_JOBS_LOCK_HEARTBEAT_SECONDS or 10)")
    return parser


def _mine(run_dir: Path, token: str) -> Lock | None:
    path = run_dir / LOCK_NAME
    try:
        holder = Holder.parse(path.read_bytes())
    except FileNotFoundError:
        return None
    return Lock(path, holder, owned=True) if holder is not None and holder.token == token else None


def _acquire(args: argparse.Namespace) -> int:
    owner = owner_from_env(os.environ)
    job_id = args.job_id if args.job_id is not None else os.environ.get("SLURM_JOB_ID", "") or owner.split(":")[-1]
    me = Holder.this(args.token or new_token(), owner, args.backend, job_id, pid=args.pid)
    lock = acquire(args.run_dir, me)
    if lock.took_over:
        print(f"dist-jobs: took over the lock of {args.run_dir}: {lock.took_over}", file=sys.stderr)
    if not args.token:
        print(lock.token)
    return 0


def _heartbeat(args: argparse.Namespace) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    lock = _mine(args.run_dir, args.token)
    watched = process_start(args.pid)
    every = heartbeat_seconds() if args.every is None else args.every
    while lock is not None and lock.beat():
        time.sleep(every)
        if watched is None or process_start(args.pid) != watched:
            return 0  # the job's shell is gone: the lock goes stale unless released
    if lock is not None and lock.current() is not None:
        print(f"dist-jobs: lost the lock of {args.run_dir} to another run", file=sys.stderr)
        return 1
    return 0


def _release(args: argparse.Namespace) -> int:
    lock = _mine(args.run_dir, args.token)
    if lock is not None:
        lock.release()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"acquire": _acquire, "heartbeat": _heartbeat, "release": _release}[args.verb](args)
    except DistJobsError as exc:
        print(f"dist-jobs: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"dist-jobs: run directory lock in {args.run_dir}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
