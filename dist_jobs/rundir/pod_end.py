"""`python3 -m dist_jobs.rundir.pod_end ...`: the pod entrypoint (templates/pod-entrypoint.sh)
asks this at its program's end what the end means (dist_jobs.rundir.verdict decides) and which
exit code the pod ends with.

A pod that goes away leaves an empty file `<run dir>/peers/<pod>`, whose time says when: told to
stop, its SIGTERM trap (in sh, at once); ended by a fault of its own (its verdict: run again, but
not a lost peer), this module before the pod exits. No pod sees another's processes, so this note
is how a pod whose program failed by itself (a user's script dies of "Connection reset by peer"
with its own exit code) learns that a peer went first: a lost peer, retried, not the program's
bug. Such a failure waits up to DIST_JOBS_PEER_WORD_SECONDS (default 10 s) for a peer's note
before it is called the program's own.

The evidence only a pod has: the program's exit code (torchrun's first failed worker's,
dist_jobs.train.torchrun, and that worker's global rank: dist_jobs.rundir.first_failure), the
PREEMPTED marker and the HANG record newer than the program's start, whether its job still holds
the run directory (only pod rank 0 takes the lock: the other pods learn a takeover here), and the
notes of peer pods that went away while the program ran. A fault that blames the pod's node (a
rank killed by a signal, once the node's restarts are used up) keeps the node away from the
job's recreated pods (dist_jobs.rundir.node_affinity) before the pod exits. Not imported by the
package: `python -m` runs it alone. Stdlib only: it runs in any image.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from dist_jobs.envnum import env_number, env_seconds
from dist_jobs.rundir.attempts import safe_name
from dist_jobs.rundir.first_failure import ENV as FIRST_FAILURE
from dist_jobs.rundir.first_failure import failure
from dist_jobs.rundir.hang import attempt_hang, describe_hang, preempted_since
from dist_jobs.rundir.holder import owner_from_env
from dist_jobs.rundir.lock import LOCK_NAME, current, stamp_of
from dist_jobs.rundir.node_affinity import ApiError, from_env, keep_nodes_off
from dist_jobs.rundir.quarantine import active_quarantines, blamed_nodes, keep_away
from dist_jobs.rundir.verdict import Action, Ending, Evidence, Verdict, decide, record, recorded

PEERS = "peers"  # folder of the run directory: a note per pod that went away (see above)
PEER_WORD_SECONDS = 10.0  # how long a failed program waits for a peer's note; a bug costs this much


def peer_left(run_dir: Path, member: str, since: float) -> str:
    """A peer other than `member` that went away since `since`, told; "" if none."""
    try:
        notes = [p for p in (run_dir / PEERS).iterdir() if p.name != safe_name(member, "pod")]
    except OSError:
        return ""
    left = sorted(p.name for p in notes if _mtime(p) >= since)
    return f"{', '.join(left)} stopped while the program ran" if left else ""


def leave_word(run_dir: Path, member: str) -> None:
    """Note that `member` goes away: its peers' programs, which fail once it is gone, lost a peer."""
    try:
        (run_dir / PEERS).mkdir(parents=True, exist_ok=True)
        (run_dir / PEERS / safe_name(member, "pod")).touch()
    except OSError:
        pass  # the peers' failures then read as their own: the job fails rather than loops


def await_peer(run_dir: Path, member: str, since: float, seconds: float) -> str:
    """peer_left(), waiting up to `seconds` for a peer's note: the peer whose fault made this
    program fail writes it only once its own program has ended, a moment after this one's."""
    deadline = time.monotonic() + seconds
    while not (left := peer_left(run_dir, member, since)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


def peers_expected(environ: Mapping[str, str]) -> bool:
    """Whether the job has other pods: PET_NNODES (the operator's: "2", or "1:4" when elastic) > 1."""
    counts = environ.get("PET_NNODES", "").split(":")
    return any(count.strip().isdigit() and int(count) > 1 for count in counts)


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


def restarts_left(run_dir: Path, submission: str, node: str, allowed: int) -> int:
    """The restarts a fault on `node` may still cost before the node is blamed: the operator's
    recreated pod is the restart in place, and `allowed` (preemption.max_restarts) of them on one
    node, counted since the job was last sent off it, are what SLURM allows one allocation."""
    used = 0
    for verdict in sorted(recorded(run_dir, submission), key=lambda v: v.time):
        if verdict.node == node and verdict.action in (Action.RESTART, Action.REQUEUE):
            used = used + 1 if verdict.action is Action.RESTART else 0
    return allowed - used


def keep_node_away(run_dir: Path, submission: str, verdict: Verdict, now: float) -> str:
    """Before the pod exits: quarantine the node the verdict blames and patch the job so that its
    recreated pods refuse it (dist_jobs.rundir.node_affinity); what was done, told ("" if nothing)."""
    if not blamed_nodes(verdict):
        return ""
    api, job = from_env()
    if not job:  # no job to patch: k8s.avoid_failed_nodes off, or a TrainJob
        return ""
    try:
        keep_away(run_dir, submission, verdict, now)
    except OSError as exc:
        return f"cannot quarantine {verdict.node}: {exc}"
    if api is None:
        return f"{verdict.node} is quarantined, but this pod has no service account token to keep it away"
    try:
        nodes = keep_nodes_off(api, job, active_quarantines(run_dir, submission, now), now)
    except (ApiError, OSError) as exc:
        return f"cannot keep {verdict.node} away from the job's pods ({exc}): they may be placed there again"
    return f"the job's pods keep away from {', '.join(nodes)} ({verdict.cause})"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m dist_jobs.rundir.pod_end",
        description="The verdict on one member's program (a pod's): prints the exit code to end with.",
    )
    p.add_argument("--rc", type=int, required=True, help="the program's exit code")
    p.add_argument("--since", type=Path, required=True, help="a file touched when the program started")
    p.add_argument("--lock-lost", action="store_true")
    p.add_argument("--leaving", action="store_true", help="this member was told to stop (SIGTERM)")
    return p


def _evidence(args: argparse.Namespace, run_dir: Path, member: str, stamp: str, since: float) -> Evidence:
    """What this pod's program, started at `since`, left (without a peer's late note: see _verdict)."""
    hang = attempt_hang(run_dir, since, stamp)
    return Evidence(
        exit_code=args.rc,
        failures=(failure(os.environ.get(FIRST_FAILURE, ""), args.rc, member),) if args.rc else (),
        preempted=args.rc != 0 and preempted_since(run_dir, since, stamp),
        hang=describe_hang(hang) if hang is not None else "",
        lock_lost=args.lock_lost or _taken_over(run_dir),
        peer_left="" if args.leaving else peer_left(run_dir, member, since),
        said="this pod was told to stop" if args.leaving else "",
        warned=args.leaving,
    )


def _verdict(args: argparse.Namespace, run_dir: Path, member: str, stamp: str, restarts: int) -> Verdict:
    """The verdict; a failure that reads as the program's own first waits for a peer's note."""
    since = _mtime(args.since)
    evidence = _evidence(args, run_dir, member, stamp, since)
    verdict = decide(evidence, restarts_left=restarts)
    if verdict.ending is Ending.PROGRAM_ERROR and not args.leaving and peers_expected(os.environ):
        seconds = env_seconds("DIST_JOBS_PEER_WORD_SECONDS", PEER_WORD_SECONDS, floor=0.0)
        left = await_peer(run_dir, member, since, seconds)
        if left:
            verdict = decide(replace(evidence, peer_left=left), restarts_left=restarts)
    return verdict


def _went_first(verdict: Verdict) -> bool:
    """Whether this pod goes away for a fault of its own: a note its peers may read as their cause.
    Not for a lost peer (a consequence: a bug's peer would make the bug read as a lost peer too)."""
    return verdict.action in (Action.RESTART, Action.REQUEUE) and verdict.ending is not Ending.PEER_LOST


def _restarts_left(run_dir: Path, submission: str, node: str) -> int:
    # The operator recreates the pod: its fresh start is the restart (no in-place loop here).
    try:  # a manifest rendered before the knob reached pods: each fault is restarted, as before
        allowed = int(env_number("DIST_JOBS_MAX_RESTARTS", 1, low=0) or 0)
    except ValueError:
        allowed = 1
    return restarts_left(run_dir, submission, node, allowed) if node else allowed


def main(argv: list[str] | None = None) -> int:
    """For the pod entrypoint: reads DIST_JOBS_CHECKPOINT_DIR, DIST_JOBS_RUN, DIST_JOBS_SUBMISSION,
    DIST_JOBS_LOCK_TOKEN (pod rank 0's lock), HOSTNAME (the pod), DIST_JOBS_NODE (its node),
    DIST_JOBS_MAX_RESTARTS, PET_NNODES and DIST_JOBS_FIRST_FAILURE from the environment, records
    the verdict, keeps a blamed node away, leaves its peers a note when it goes away for a fault,
    tells both on stderr and prints the exit code: 0, 200 (the operator's ExitCode policy
    recreates the pod), 6, or the program's own code (1-127: permanent)."""
    run_dir = Path(os.environ.get("DIST_JOBS_CHECKPOINT_DIR", ".")) / os.environ.get("DIST_JOBS_RUN", "")
    member, node = os.environ.get("HOSTNAME", ""), os.environ.get("DIST_JOBS_NODE", "")
    submission = os.environ.get("DIST_JOBS_SUBMISSION", "")
    args = _parser().parse_args(argv)
    # Pod rank 0 holds the lock (the entrypoint exports its token): what another holder left is not
    # this program's. The other pods know no token: the start time alone says.
    stamp = stamp_of(os.environ.get("DIST_JOBS_LOCK_TOKEN", "").strip())
    verdict = _verdict(args, run_dir, member, stamp, _restarts_left(run_dir, submission, node))
    now = time.time()
    verdict = replace(verdict, node=node or member, time=now, stamp=stamp)
    try:
        record(run_dir, submission, verdict)
    except OSError as exc:
        print(f"dist-jobs: cannot record the verdict: {exc}", file=sys.stderr)
    if _went_first(verdict) and not args.leaving:  # told to stop, its trap said so already
        leave_word(run_dir, member)  # first: the peers wait for it
    kept = keep_node_away(run_dir, submission, verdict, now)
    print(f"dist-jobs: {member or 'this pod'}: {verdict.told()} (exit {verdict.exit_code})", file=sys.stderr)
    if kept:
        print(f"dist-jobs: {kept}", file=sys.stderr)
    print(verdict.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
