"""The restart cap of a run, counted in its run directory on shared storage.

    python3 -m dist_jobs.rundir.attempts start   # before the program: count this start, or refuse
    python3 -m dist_jobs.rundir.attempts done    # after it succeeded: close this member's count

Kubernetes' training operator does not cap restarts under restartPolicy ExitCode: its retry
counter is never incremented (kubeflow/trainer#2045), so a pod that keeps exiting with 128 or
more is recreated forever. SLURM requeues that come from outside the batch script (scontrol
requeue, preemption with requeue) escape the script's own cap. So every start of a pod, or of the
batch script, appends one line to <checkpoint dir>/<run>/attempts/<submission>/<member>, and the
start after `max_requeues` restarts exits with REQUEUE_LIMIT_EXIT_CODE (1-127: no scheduler
retries it) and says why. Each member writes only its own file: no lock, no lost update.

Read from the environment the backends render: DIST_JOBS_CHECKPOINT_DIR, DIST_JOBS_RUN,
DIST_JOBS_MAX_REQUEUES, DIST_JOBS_SUBMISSION (this submission: the SLURM job id, or the pod
annotation `dist-jobs submit` stamps; empty for a manifest applied with kubectl, whose count then
spans submissions of the run until one succeeds) and HOSTNAME (the member: a pod's name, which
the operator keeps across restarts). Stdlib only: it runs before the program, in any image.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dist_jobs.constants import REQUEUE_LIMIT_EXIT_CODE

UNSTAMPED = "unstamped"
DONE = ".done"  # suffix of a member's record once it succeeded


def safe_name(text: str, fallback: str) -> str:
    """`text` as one file name of a run directory: runs of other characters become `-`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-") or fallback


@dataclass(frozen=True)
class Attempts:
    """One member's start count for one submission of a run."""

    path: Path
    max_requeues: int
    member: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Attempts:
        env = os.environ if environ is None else environ
        missing = [n for n in ("DIST_JOBS_CHECKPOINT_DIR", "DIST_JOBS_RUN", "DIST_JOBS_MAX_REQUEUES") if not env.get(n)]
        if missing:
            raise ValueError(f"{', '.join(missing)} not set (the rendered job sets them)")
        member = safe_name(env.get("HOSTNAME") or socket.gethostname(), "member")
        submission = safe_name(env.get("DIST_JOBS_SUBMISSION", ""), UNSTAMPED)
        run_dir = Path(env["DIST_JOBS_CHECKPOINT_DIR"]) / env["DIST_JOBS_RUN"]
        return cls(run_dir / "attempts" / submission / member, int(env["DIST_JOBS_MAX_REQUEUES"]), member)

    def count(self) -> int:
        try:
            return len(self.path.read_text().splitlines())
        except FileNotFoundError:
            return 0

    def start(self) -> tuple[bool, str]:
        """Count this start unless it would exceed the cap; (allowed, what to print)."""
        done = self.count()
        allowed = self.max_requeues + 1
        if done >= allowed:
            return False, (
                f"dist-jobs: {self.member} has started {done} times for this submission and "
                f"preemption.max_requeues is {self.max_requeues}: not starting again, the job fails "
                f"(exit {REQUEUE_LIMIT_EXIT_CODE}) instead of restarting forever. Its checkpoints are "
                "kept: resubmit the job to resume, with a higher max_requeues if the restarts were expected."
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with open(self.path, "a", encoding="utf-8") as fh:  # O_APPEND: one short line, one write
            fh.write(f"{stamp} pid {os.getpid()}\n")
        return (
            True,
            f"dist-jobs: {self.member} start {done + 1} of at most {allowed} (max_requeues {self.max_requeues})",
        )

    def done(self) -> None:
        """Close this member's count: kept as `<member>.done`, which no start reads (a manifest
        applied again starts afresh) but `starts()` still counts once the job has ended."""
        try:
            os.replace(self.path, self.path.with_name(self.path.name + DONE))
        except FileNotFoundError:
            pass


def starts(run_dir: Path, submission: str) -> int:
    """How many times the submission's most-started member started, its closed count included:
    the attempts the run directory saw (a scheduler's own count may merge some)."""
    counts = []
    try:
        for record in (run_dir / "attempts" / safe_name(submission, UNSTAMPED)).iterdir():
            counts.append(len(record.read_text(errors="replace").splitlines()))
    except OSError:  # no records (not started, or an older version's success removed them)
        pass
    return max(counts, default=0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["start"], ["done"]):
        print("usage: python3 -m dist_jobs.rundir.attempts start|done", file=sys.stderr)
        return 2
    try:
        attempts = Attempts.from_env()
        if args == ["done"]:
            attempts.done()
            return 0
        allowed, message = attempts.start()
    except (OSError, ValueError) as exc:
        # A run directory that cannot be written fails the training anyway, with its own message.
        print(f"dist-jobs: cannot count restarts ({exc}); restarts of this run are not capped", file=sys.stderr)
        return 0
    print(message, file=sys.stderr if not allowed else sys.stdout, flush=True)
    return 0 if allowed else REQUEUE_LIMIT_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
