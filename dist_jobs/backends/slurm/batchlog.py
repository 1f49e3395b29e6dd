"""What the batch script's own log says about how the job ended (pure; real captured logs in
tests/fixtures/slurm/). sacct alone cannot tell: it reports the step of a job whose rank 1
exited with 3 as CANCELLED 0:15 (srun stopped the other ranks) and masks exit codes to 7 bits
(a batch script's 200, "requeue me", reads as 72). The log has srun's per-task lines, the
script's true exit code and its requeue decisions:

    srun: error: n1: task 1: Exited with exit code 3
    srun: error: n2: tasks 2-3: Terminated
    dist-jobs: requeueing job 7: requeue 1 of at most 5
    dist-jobs: preempted, but the maximum of 5 requeues is reached
    dist-jobs: step finished with exit code 143

A cancel (scancel, `dist-jobs cancel`) leaves slurmstepd's `*** JOB 9 ON n1 CANCELLED AT <time> ***`
(a requeue or a time limit adds `DUE TO ...`): its ranks were stopped by it, not by a failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.backends.slurm.squeue_sacct import SacctJobState, sacct_exit
from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.rundir.hang import HangRecord
from dist_jobs.rundir.verdict import NOT_RETRIED, Action, Failure, Verdict

_ATTEMPT = re.compile(r"^dist-jobs: job \S+ attempt (\d+) on ", re.M)
_TASK = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+?)\s*$", re.M)
_EXITED = re.compile(r"Exited with exit code (\d+)")
_RESTART = re.compile(r"^dist-jobs: restarting in place: ", re.M)
_STEP_END = re.compile(r"^dist-jobs: step finished with exit code (\d+)", re.M)
_USED_UP = re.compile(r"maximum of (\d+) requeues is reached")
_CANCELLED = re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT (\S+)( DUE TO [^*]*)? \*\*\*")
# The batch script's own words once the lock is another run's, and the heartbeat's naming the new holder.
_LOCK_LOST = re.compile(r"^dist-jobs: this job lost the run directory lock", re.M)
_HELD_BY = re.compile(r"^dist-jobs: lost the lock of run directory .* \(it is now held by (.+?)\): ", re.M)
_NOT_ASSIGNED = "None assigned"  # sacct's node list of a job that never got nodes
_SIGNALS = {"Terminated": "SIGTERM", "Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT"}


@dataclass(frozen=True)
class BatchOutcome:
    attempt: int | None = None  # the last attempt the log shows
    first_failed: int | None = None  # the first rank srun reported failing (torchrun mode: a node's task)
    ranks: dict[int, str] = field(default_factory=dict, hash=False)
    exit_code: int | None = None  # the batch script's own, unmasked
    requeues_used_up: int | None = None  # the maximum, when a preempted run hit it
    cancelled_at: str | None = None  # when a cancel stopped the last attempt (slurmstepd's time)
    lock_lost: str | None = None  # another run took the run directory over: who holds it ("" unknown)

    @property
    def summary(self) -> str:
        return self.told("rank")

    def told(self, unit: str) -> str:
        """The outcome in a line; `unit`: what srun's task is (rank; in torchrun mode a node)."""
        if self.lock_lost is not None:  # the ranks were killed for it: that is the whole story
            holder = f" (now held by {self.lock_lost})" if self.lock_lost else ""
            return f"lost the run directory lock to another run{holder}: stopped without writing more (exit 6)"
        parts = []
        if self.first_failed is not None:
            parts.append(f"{unit} {self.first_failed} failed first: {self.ranks[self.first_failed]}")
        if self.cancelled_at is not None:
            parts.append(f"cancelled at {self.cancelled_at.replace('T', ' ')}")
        elif self.requeues_used_up is not None:
            n = self.requeues_used_up
            parts.append(f"preempted with the requeues used up ({n} of {n})")
        elif self.exit_code is not None and not parts:
            parts.append(describe_exit(self.exit_code))
        return "; ".join(parts)


def _tasks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def _what(text: str, cancelled: bool) -> tuple[str, bool]:
    """(what happened to the task, whether it failed by itself rather than being stopped)."""
    exited = _EXITED.search(text)
    if exited:
        code = int(exited.group(1))
        return describe_exit(code), code != REQUEUE_EXIT_CODE  # 200: checkpointed on a signal
    name = _SIGNALS.get(text)
    if cancelled and name in ("SIGTERM", "SIGKILL"):  # SIGKILL: what did not stop within KillWait
        return "cancelled", False
    if name == "SIGTERM":
        return "stopped (SIGTERM) after another rank failed", False
    return (f"killed by {name}" if name else text), True


def srun_failures(text: str, cancelled: bool = False, tasks_are_ranks: bool = True) -> tuple[Failure, ...]:
    """The tasks that failed by themselves, in the order srun reported them (the first is the
    cause), from srun's own `srun: error: NODE: task N: ...` lines; the tasks srun stopped after
    them are left out. `tasks_are_ranks`: False in torchrun mode, where a task is a node's
    torchrun: its number is no rank, and its failure is told by its node alone."""
    found: list[Failure] = []
    for match in _TASK.finditer(text):
        what = match.group("what")
        exited = _EXITED.search(what)
        if not exited and not _what(what, cancelled)[1]:
            continue
        code, sig = (int(exited.group(1)), None) if exited else (None, _SIGNALS.get(what, what))
        tasks = _tasks(match.group("tasks"))
        found.extend(Failure(task if tasks_are_ranks else None, match.group("node"), code, sig) for task in tasks)
    return tuple(found)


def parse_batch_log(text: str) -> BatchOutcome:
    """The outcome of the last attempt in a batch log (--open-mode=append keeps every attempt)."""
    starts = list(_ATTEMPT.finditer(text))
    last = text[starts[-1].start() :] if starts else text
    restarts = list(_RESTART.finditer(last))
    step = last[restarts[-1].start() :] if restarts else last  # the attempt's last step
    ranks: dict[int, str] = {}
    first: int | None = None
    cancels = [m.group(1) for m in _CANCELLED.finditer(step) if not m.group(2)]
    for match in _TASK.finditer(step):
        what, failed = _what(match.group("what"), bool(cancels))
        for task in _tasks(match.group("tasks")):
            ranks.setdefault(task, f"{what} on {match.group('node')}")
            if failed and first is None:
                first = task
    ends = _STEP_END.findall(last)
    used_up = _USED_UP.findall(last)
    holders = _HELD_BY.findall(step)
    return BatchOutcome(
        attempt=int(starts[-1].group(1)) if starts else None,
        first_failed=first,
        ranks=ranks,
        exit_code=int(ends[-1]) if ends else None,
        requeues_used_up=int(used_up[-1]) if used_up else None,
        cancelled_at=cancels[-1] if cancels else None,
        lock_lost=(holders[-1] if holders else "") if _LOCK_LOST.search(step) else None,
    )


def finished_status(
    state: SacctJobState,
    run: str,
    log_text: str,
    launcher: str = "srun",
    starts: int = 0,
    hang: HangRecord | None = None,
    verdicts: Sequence[Verdict] = (),
) -> JobStatus:
    """A job squeue has forgotten: sacct's state, told truthfully with its batch log (if read).

    `run`: the run name recorded at submit; sacct's name right after the end is a placeholder
    (`allocation`, with no partition yet) until slurmdbd merges the job record. `starts`: the
    batch script's starts the run directory counted (dist_jobs.rundir.attempts); sacct lists
    one line per requeue only when it saw the job pending in between, so it may count fewer.
    `hang`: the run directory's hang record, if any: a watchdog exit of the last attempt reads as
    its describe_hang() ("hang: rank 3 on n2 stopped at step 812; ..."). `verdicts`: what the
    batch script decided after each step of the job (dist_jobs.rundir.verdict): a program's own
    error says it was not retried, and the restarts in place are counted.
    """
    outcome = parse_batch_log(log_text)
    name = run if (state.name == "allocation" and run) else state.name
    extra = {"nodes": state.nodelist, "elapsed": state.elapsed, "attempts": str(max(state.attempts, starts))}
    if state.state == "CANCELLED" and state.nodelist == _NOT_ASSIGNED:  # sacct says exit 0: nothing ran
        detail = "cancelled while pending: it never started, so it has no exit code"
        return JobStatus(state.job_id, name, state.state, detail, {**extra, "nodes": "", "attempts": "0"})
    code = state.exit_code if outcome.exit_code is None else outcome.exit_code
    # torchrun mode runs one srun task per node: srun's task numbers are nodes, not ranks
    detail = outcome.told("node" if launcher == "torchrun" else "rank")
    if not detail and state.state == "CANCELLED":  # sacct's 0:0 of a cancelled job is no exit code
        detail = "cancelled" + (f" at {state.end:%Y-%m-%d %H:%M:%S}" if state.end else "")
    if not detail:
        detail = (
            describe_exit(code, state.exit_signal)
            if outcome.exit_code is not None
            else sacct_exit(code, state.exit_signal)
        )
    if code == REQUEUE_EXIT_CODE and hang is not None and hang.belongs_to(job=state.job_id, attempt=outcome.attempt):
        detail = describe_exit(code, hang=hang)  # the watchdog's exit, not a preemption
        if outcome.requeues_used_up is not None:
            detail += f"; the requeues are used up ({outcome.requeues_used_up} of {outcome.requeues_used_up})"
    restarts = sum(v.action is Action.RESTART for v in verdicts)
    if restarts:
        extra["restarts_in_place"] = str(restarts)
    if verdicts and verdicts[-1].action is Action.FAIL:
        detail += f"; {NOT_RETRIED}"
    return JobStatus(state.job_id, name, state.state, detail, extra, outcome.ranks if launcher != "torchrun" else {})
