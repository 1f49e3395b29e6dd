"""`python3 -m dist_jobs.rundir.pod_end ...`: the pod entrypoint (templates/pod-entrypoint.sh)
asks this at its program's end what the end means (dist_jobs.rundir.verdict decides) and which
exit code the pod ends with. A pod told to stop leaves an empty file `<run dir>/peers/<pod>`
(its SIGTERM trap, in sh), whose time says when.

The evidence only a pod has: the code its first failing process noted, the PREEMPTED marker and
the HANG record newer than the program's start, whether its job still holds the run directory
(only pod rank 0 takes the lock: the other pods learn a takeover here), and the notes of peer
pods told to stop while the program ran. Not imported by the package: `python -m` runs it alone.
Stdlib only: it runs in any image.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from dist_jobs.rundir.attempts import safe_name
from dist_jobs.rundir.hang import attempt_hang, describe_hang, preempted_since
from dist_jobs.rundir.holder import owner_from_env
from dist_jobs.rundir.lock import LOCK_NAME, current, stamp_of
from dist_jobs.rundir.verdict import Evidence, Failure, decide, record

PEERS = "peers"  # folder of the run directory: a note per pod told to stop (the entrypoint's trap)


def peer_left(run_dir: Path, member: str, since: float) -> str:
    """A peer other than `member` that was told to stop since `since`, told; "" if none."""
    try:
        notes = [p for p in (run_dir / PEERS).iterdir() if p.name != safe_name(member, "pod")]
    except OSError:
        return ""
    left = sorted(p.name for p in notes if _mtime(p) >= since)
    return f"{', '.join(left)} stopped while the program ran" if left else ""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _taken_over(run_dir: Path) -> bool:
    """Whether another job holds the run directory's lock now: a pod that holds no lock itself
    (only pod rank 0 takes it) learns here that its job lost the run directory, and stops too."""
    owner = owner_from_env(os.environ)
    holder = current(run_dir / LOCK_NAME)
    return bool(owner) and holder is not None and holder.owner != owner


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m dist_jobs.rundir.pod_end",
        description="The verdict on one member's program (a pod's): prints the exit code to end with.",
    )
    p.add_argument("--rc", type=int, required=True, help="the program's exit code")
    p.add_argument("--first", type=int, help="the code the member's first failing process noted")
    p.add_argument("--since", type=Path, required=True, help="a file touched when the program started")
    p.add_argument("--lock-lost", action="store_true")
    p.add_argument("--leaving", action="store_true", help="this member was told to stop (SIGTERM)")
    return p


def main(argv: list[str] | None = None) -> int:
    """For the pod entrypoint: reads DIST_JOBS_CHECKPOINT_DIR, DIST_JOBS_RUN, DIST_JOBS_SUBMISSION,
    DIST_JOBS_LOCK_TOKEN (pod rank 0's lock) and HOSTNAME (the pod) from the
    environment, records the verdict, tells it on stderr and prints the exit code: 0, 200 (the
    operator's ExitCode policy recreates the pod), 6, or the program's own code (1-127: permanent)."""
    run_dir = Path(os.environ.get("DIST_JOBS_CHECKPOINT_DIR", ".")) / os.environ.get("DIST_JOBS_RUN", "")
    member = os.environ.get("HOSTNAME", "")
    args = _parser().parse_args(argv)
    since = _mtime(args.since)
    code = args.first if args.rc and args.first else args.rc
    # Pod rank 0 holds the lock (the entrypoint exports its token): what another holder left is not
    # this program's. The other pods know no token: the start time alone says.
    stamp = stamp_of(os.environ.get("DIST_JOBS_LOCK_TOKEN", "").strip())
    hang = attempt_hang(run_dir, since, stamp)
    evidence = Evidence(
        exit_code=args.rc,
        failures=(Failure(None, member, code),) if code else (),
        preempted=args.rc != 0 and preempted_since(run_dir, since, stamp),
        hang=describe_hang(hang) if hang is not None else "",
        lock_lost=args.lock_lost or _taken_over(run_dir),
        peer_left="" if args.leaving else peer_left(run_dir, member, since),
        said="this pod was told to stop" if args.leaving else "",
        warned=args.leaving,
    )
    # The operator recreates the pod: its fresh start is the restart (no in-place loop here).
    verdict = replace(decide(evidence, restarts_left=1), node=member, time=time.time(), stamp=stamp)
    try:
        record(run_dir, os.environ.get("DIST_JOBS_SUBMISSION", ""), verdict)
    except OSError as exc:
        print(f"dist-jobs: cannot record the verdict: {exc}", file=sys.stderr)
    print(f"dist-jobs: {member or 'this pod'}: {verdict.told()} (exit {verdict.exit_code})", file=sys.stderr)
    print(verdict.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
