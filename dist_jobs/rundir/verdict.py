"""How an attempt ended: one verdict, decided once from what the attempt left, acted on by every
launcher (the sbatch script, the pod entrypoint, the local launcher) and told by `status`.

A launcher collects the evidence (which process failed first and how, whether the scheduler
warned or cancelled the job, the PREEMPTED marker, the HANG record, the lock, the nodes that no
longer answer, a peer that left) and `decide()` says what it means and what to do:

    completed                  -> done
    preempted (warned, marker) -> requeue
    node lost                  -> requeue, elsewhere (SLURM's own requeue of a failed node's job: nothing)
    node unfit (its node check) -> requeue, elsewhere
    rank killed by a signal nobody sent us, a peer lost, a hang
                               -> restart in place (while the allocation has restarts left), else requeue
    the program's own exit     -> fail at once: a bug is not retried
    lock lost                  -> stop, write nothing more
    cancelled                  -> nothing: the scheduler ends the job

A rank that died because a peer vanished is a consequence, not a cause: only the first failure
counts, and what the launcher stopped after it does not. The pod entrypoint asks through
`python -m dist_jobs.rundir.pod_end`, the batch script through dist_jobs.backends.slurm.step_end;
every verdict is recorded in `<run dir>/verdicts/<submission>.jsonl`,
which status reads back. Each line carries the stamp of the lock its launcher held
(dist_jobs.rundir.stamps): a verdict an older attempt lands after a newer attempt's is a late
write, and `recorded()` leaves it out. Stdlib only: it runs in any image, before and after the program.
"""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from dist_jobs.constants import LOCK_LOST_EXIT_CODE, REQUEUE_EXIT_CODE
from dist_jobs.rundir.attempts import UNSTAMPED, safe_name
from dist_jobs.rundir.history import read_objects
from dist_jobs.rundir.stamps import live_rows

VERDICTS = "verdicts"  # folder of the run directory: one JSON-lines file per submission
# A shell's "killed by signal N" (128+N), short of the requeue code.
_SIGNAL_DEATHS = range(129, 128 + 65)


class Ending(str, Enum):
    COMPLETED = "completed"
    PREEMPTED = "preempted"
    NODE_LOST = "node lost"
    NODE_UNFIT = "node unfit"  # it answers, but failed the node check (no shared run directory, a GPU gone)
    RANK_KILLED = "rank killed"
    PEER_LOST = "peer lost"
    HANG = "hang"
    PROGRAM_ERROR = "program error"
    LOCK_LOST = "lock lost"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class Action(str, Enum):
    DONE = "done"
    REQUEUE = "requeue"
    RESTART = "restart"
    FAIL = "fail"
    STOP = "stop"
    NONE = "none"  # the scheduler acts (a cancel)

    def __str__(self) -> str:
        return self.value


# What a fault-free allocation retries in place; what only a new allocation can fix.
_RESTARTABLE = (Ending.RANK_KILLED, Ending.PEER_LOST, Ending.HANG)
# What a program's own error gets, as status says it on every backend.
NOT_RETRIED = "failed at once: the program's own error is not retried"


@dataclass(frozen=True)
class Failure:
    """One process that ended badly, as its launcher saw it."""

    rank: int | None  # global rank (torchrun mode on SLURM: the node's task), None when unknown
    node: str = ""
    code: int | None = None  # its exit code, when it exited
    signal: str | None = None  # "SIGKILL", when a signal ended it

    def told(self) -> str:
        if self.signal:
            what = f"killed by {self.signal}"
        elif self.code is not None and self.code in _SIGNAL_DEATHS:
            what = f"killed by {signal_name(self.code - 128)} (exit {self.code})"
        elif self.code == REQUEUE_EXIT_CODE:
            what = f"exit {self.code} (asked to run again)"  # a checkpoint on a signal, or a lost peer
        else:
            what = f"exit {self.code}"
        return what + (f" on {self.node}" if self.node else "")

    @property
    def by_signal(self) -> bool:
        return self.signal is not None or (self.code is not None and self.code in _SIGNAL_DEATHS)


@dataclass(frozen=True)
class Evidence:
    """What an attempt left. `failures`: the processes that failed by themselves, first first
    (those its launcher stopped afterwards are left out)."""

    exit_code: int
    failures: tuple[Failure, ...] = ()
    warned: bool = False  # the scheduler's preemption or time-limit warning reached the job
    cancelled: bool = False  # a cancel (scancel, dist-jobs cancel, an outside requeue) reached it
    preempted: bool = False  # the PREEMPTED marker is newer than the attempt's start
    hang: str = ""  # the HANG record of this attempt, told ("rank 3 stopped at step 812"), "" if none
    lock_lost: bool = False
    lost_nodes: tuple[str, ...] = ()  # nodes of the allocation that no longer answer
    unfit: tuple[tuple[str, str], ...] = ()  # (node, why): nodes that answer but failed the node check
    peer_left: str = ""  # a peer that was deleted or failed while the program ran ("pod w-1")
    step_lost: str = ""  # the launcher never heard its tasks end and was ended (its step was gone)
    said: str = ""  # the launcher's own words for a preemption or a cancel ("stopped by SIGTERM ...")


@dataclass(frozen=True)
class Verdict:
    ending: Ending
    action: Action
    exit_code: int  # what the launcher exits with (documented codes: 200 requeue, 6 lock lost, ...)
    cause: str = ""  # the first failure or the record that decided it, told
    rank: int | None = None
    node: str = ""
    attempt: str = ""  # the launcher's label: "0", "0.1" (attempt 0, first restart in place)
    time: float = 0.0
    extra: dict[str, str] = field(default_factory=dict, hash=False)
    stamp: str = ""  # the stamp of the lock the launcher held ("" for none: a pod that holds no token)
    failure: str = ""  # the first failure's own end, told ("exit 3 on n1"), "" where none decided it

    @property
    def fault_in_place(self) -> bool:
        """A fault a restart inside the same allocation may cure, if every node still answers."""
        return self.ending in _RESTARTABLE

    def told(self) -> str:
        """One line for status and the logs: what ended the attempt and what happens next."""
        cause = f": {self.cause}" if self.cause else ""
        then = {
            Action.DONE: "",
            Action.REQUEUE: "; to resume from the latest checkpoint",
            Action.RESTART: "; restarted in place from the latest checkpoint",
            Action.FAIL: "; failed at once (the program's own error is not retried)",
            Action.STOP: "; stopped without writing more",
            Action.NONE: "",
        }[self.action]
        if self.ending is Ending.PROGRAM_ERROR:
            return f"the program failed{cause}{then}"
        if self.ending is Ending.HANG and self.cause:  # the hang record's sentence names itself
            return f"{self.cause}{then}"
        return f"{self.ending}{cause}{then}"

    def in_status(self) -> str:
        """The verdict as `status` tells an ended attempt: a failure by the process that failed
        first (`rank 1 failed first: exit 3 on n1; failed at once: ...`), anything else by its
        ending and the exit code its launcher ended with."""
        if self.action is Action.DONE:
            return f"exit {self.exit_code}"
        if self.ending is Ending.PROGRAM_ERROR:
            # a record written before verdicts kept the failure's own words has its cause alone
            first = f"rank {self.rank} failed first: {self.failure}" if self.rank is not None else self.failure
            return f"{first if self.failure else self.cause}; {NOT_RETRIED}"
        return f"{self.told()} (exit {self.exit_code})"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Verdict:
        return cls(
            ending=Ending(data["ending"]),
            action=Action(data["action"]),
            exit_code=int(data["exit_code"]),
            cause=str(data.get("cause", "")),
            rank=None if data.get("rank") is None else int(data["rank"]),
            node=str(data.get("node", "")),
            failure=str(data.get("failure", "")),
            attempt=str(data.get("attempt", "")),
            time=float(data.get("time", 0.0)),
            extra={str(k): str(v) for k, v in dict(data.get("extra") or {}).items()},
            stamp=str(data.get("stamp") or ""),
        )


def decide(evidence: Evidence, *, restarts_left: int = 0) -> Verdict:
    """The verdict on an attempt. `restarts_left`: restarts in place this allocation may still
    do; with none left a restartable fault gives the allocation up (requeue)."""
    verdict = _classify(evidence)
    if verdict.action is Action.RESTART and restarts_left <= 0:
        verdict = replace(verdict, action=Action.REQUEUE, extra={"restarts": "used up"})
    return verdict


def _classify(ev: Evidence) -> Verdict:
    first = _first(ev)
    if ev.lock_lost:
        return Verdict(Ending.LOCK_LOST, Action.STOP, LOCK_LOST_EXIT_CODE, "another run took the run directory over")
    lost = ", ".join(ev.lost_nodes)
    if ev.cancelled and lost:  # SLURM requeues a job whose node failed itself: it acts, the node is to blame
        return Verdict(Ending.NODE_LOST, Action.NONE, ev.exit_code, f"{lost} no longer answered", node=lost)
    if ev.cancelled:  # the ranks' own endings followed the cancel: none of them is its cause
        return Verdict(Ending.CANCELLED, Action.NONE, ev.exit_code, ev.said or "a cancel or a requeue from outside")
    if lost:
        return Verdict(Ending.NODE_LOST, Action.REQUEUE, REQUEUE_EXIT_CODE, f"{lost} no longer answered", node=lost)
    if ev.unfit:  # its ranks would start from an empty run directory, or find no GPU: not there again
        why = "; ".join(f"{node} {problem}" for node, problem in ev.unfit)
        unfit = ",".join(node for node, _ in ev.unfit)
        return Verdict(Ending.NODE_UNFIT, Action.REQUEUE, REQUEUE_EXIT_CODE, why, node=unfit)
    if first is None:
        return Verdict(Ending.COMPLETED, Action.DONE, 0)
    ending, cause = _of_failure(ev, first)
    if ending is Ending.PROGRAM_ERROR:
        return _blamed(first, ending, Action.FAIL, first.code or 1, cause)
    action = Action.REQUEUE if ending is Ending.PREEMPTED else Action.RESTART
    return _blamed(first, ending, action, REQUEUE_EXIT_CODE, cause)


def _first(ev: Evidence) -> Failure | None:
    """The failure that caused the others. A process that asked to run again (exit 200: it lost a
    peer, or checkpointed on a signal) did so because of something else: another failure, if any,
    is that cause, whichever the launcher heard of first (a node's torchrun notices its killed
    worker later than the other node's ranks notice the lost peer). Without srun's or the
    launcher's word on a process, the step's own exit code is the failure."""
    if not ev.failures:
        return Failure(None, code=ev.exit_code) if ev.exit_code else None
    return next((f for f in ev.failures if f.code != REQUEUE_EXIT_CODE), ev.failures[0])


def _of_failure(ev: Evidence, first: Failure) -> tuple[Ending, str]:
    """What ended an attempt whose process `first` failed first, and the words for its cause."""
    told = (f"rank {first.rank} " if first.rank is not None else "") + first.told()
    if ev.hang:
        return Ending.HANG, ev.hang
    if ev.preempted or ev.warned:
        return Ending.PREEMPTED, ev.said or (
            "the scheduler's warning reached the job" if ev.warned else "checkpointed on a signal"
        )
    if ev.step_lost and not ev.failures:  # srun killed by its watcher: its exit is not a rank's
        return Ending.PEER_LOST, ev.step_lost
    if first.by_signal:
        return Ending.RANK_KILLED, told
    if ev.peer_left or first.code == REQUEUE_EXIT_CODE:  # the built-in trainer's exit on a lost peer
        return Ending.PEER_LOST, ev.peer_left or told
    return Ending.PROGRAM_ERROR, told


def _blamed(first: Failure, ending: Ending, action: Action, exit_code: int, cause: str) -> Verdict:
    """A verdict on the process that failed first: its rank, node and own end recorded with it."""
    return Verdict(ending, action, exit_code, cause, rank=first.rank, node=first.node, failure=first.told())


def signal_name(number: int) -> str:
    """ "SIGKILL" for 9; "signal N" for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def record(run_dir: Path, submission: str, verdict: Verdict) -> None:
    """Append the verdict to the submission's record (one short line, one O_APPEND write). A run
    that lost its lock writes nothing more into the run directory, which is another run's now:
    its verdict is told in its log only."""
    if verdict.ending is Ending.LOCK_LOST:
        return
    path = _record_of(run_dir, submission)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(verdict.to_json() + "\n")


def recorded(run_dir: Path, submission: str) -> list[Verdict]:
    """Every verdict of a submission, oldest first, without the late ones (a superseded
    attempt's, landing after its successor's); unreadable lines are skipped."""
    found = []
    for row in live_rows(read_objects(_record_of(run_dir, submission)))[0]:
        try:
            found.append(Verdict.from_record(row))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def _record_of(run_dir: Path, submission: str) -> Path:
    return run_dir / VERDICTS / f"{safe_name(submission, UNSTAMPED)}.jsonl"
