"""`python3 -m dist_jobs.launch -- CMD ...`: the per-task launcher every dist-jobs launch mode shares.

It reads the scheduler's variables (SLURM task, PyTorchJob pod, the local backend's emulation,
torchrun), runs the loud self-check, exports torch's env:// contract (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT) and a CPU thread
count, then replaces itself with CMD (exec: no extra process, signals reach CMD directly). An
unmodified `dist.init_process_group("gloo")` script works under it.

Stdlib only, and it imports nothing but `dist_jobs.ranks`, so it costs one small interpreter
start. `python`/`python3` as CMD's program means this interpreter: the job's python, which has
dist-jobs (and, for the user's script, torch) installed, whatever PATH says.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from dist_jobs.errors import DistJobsError, UsageError
from dist_jobs.ranks import resolve
from dist_jobs.ranks.selfcheck import check
from dist_jobs.ranks.threads import available_cpus, default_threads

USAGE = "usage: python3 -m dist_jobs.launch [--] COMMAND [ARG ...]"


def launch_env(environ: Mapping[str, str], cpus: int | None = None) -> dict[str, str]:
    """The environment CMD runs with; raises RankError when the launch is inconsistent."""
    info = resolve(environ)
    check(info, environ=environ)
    env = dict(environ)
    env.update(info.env_vars())
    if not env.get("OMP_NUM_THREADS", "").strip():  # the user's setting wins
        env["OMP_NUM_THREADS"] = str(default_threads(environ, info.local_world_size, cpus or available_cpus()))
    return env


def command(argv: Sequence[str]) -> list[str]:
    """CMD from the launcher's arguments (an optional leading `--`); python means this python."""
    args = list(argv[1:] if argv and argv[0] == "--" else argv)
    if not args:
        raise UsageError("no command to launch", hint=USAGE)
    if args[0] in ("python", "python3"):
        args[0] = sys.executable
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Exec the command; returns only on failure (2 usage, 3 bad launch, 127 not found)."""
    try:
        args = command(sys.argv[1:] if argv is None else argv)
        env = launch_env(os.environ)
    except DistJobsError as exc:
        print(f"dist-jobs launch: {exc}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(
            f"dist-jobs launch: cannot run {args[0]!r}: {exc.strerror}\n  hint: check the command "
            "and that it is installed on the compute nodes",
            file=sys.stderr,
        )
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0  # unreachable: exec replaced this process
