"""Never the same bad node twice: the nodes a job keeps away from, recorded in its run directory.

A node that failed an attempt (it stopped answering, or a rank died there by a signal and the
restarts in place are used up) is kept away from the job's next attempts for a while: the
launcher asks `keep_away()` which nodes the verdict blames, records each one here, and asks the
scheduler to exclude them (SLURM: `scontrol update JobId=... ExcNodeList=...` on the requeued
job), so a node whose daemon comes back before the job starts again (a flapping node) is not
handed back. `<run dir>/quarantine.jsonl` holds one line per node kept away: which, why, by
which job, when, and until when; status reads it back to say which node is kept away and why.
Stdlib only: it runs in the batch script, before and after the program.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from dist_jobs.rundir.progress import read_json_lines
from dist_jobs.rundir.verdict import Action, Ending, Verdict

QUARANTINE = "quarantine.jsonl"  # file of the run directory
KEEP_AWAY_SECONDS = 3600.0  # long enough for an administrator to look; a flapping node stays out meanwhile


@dataclass(frozen=True)
class Quarantine:
    node: str
    why: str  # the verdict's cause: "n2 no longer answered", "rank 3 killed by SIGKILL on n2"
    job: str  # the submission that kept it away (SLURM job id)
    time: float  # when (time.time())
    until: float  # when it may be used again

    def active(self, now: float) -> bool:
        return now < self.until

    def told(self) -> str:
        until = time.strftime("%H:%M:%S", time.localtime(self.until))
        return f"{self.node} ({self.why}; until {until})"


def blamed_nodes(verdict: Verdict) -> tuple[str, ...]:
    """The nodes the verdict blames for the attempt's end: those that no longer answered or failed
    their node check, or the node of a rank killed by a signal once the allocation gave up
    restarting in place."""
    if verdict.ending in (Ending.NODE_LOST, Ending.NODE_UNFIT):
        return tuple(n.strip() for n in verdict.node.split(",") if n.strip())
    if verdict.ending is Ending.RANK_KILLED and verdict.action is Action.REQUEUE and verdict.node:
        return (verdict.node,)
    return ()


def keep_away(
    run_dir: Path, job: str, verdict: Verdict, now: float, seconds: float = KEEP_AWAY_SECONDS
) -> list[Quarantine]:
    """Record every node the verdict blames as kept away from `job` until `now + seconds`; the
    new records (none when the verdict blames no node). A node already kept away keeps its record:
    handed back anyway, it is refused again until the same time, not an hour more."""
    held = {q.node for q in active_quarantines(run_dir, job, now)}
    blamed = [node for node in blamed_nodes(verdict) if node not in held]
    found = [Quarantine(node, verdict.cause, job, now, now + seconds) for node in blamed]
    if found:
        path = run_dir / QUARANTINE
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:  # one O_APPEND write: no lock needed
            fh.write("".join(json.dumps(asdict(q), sort_keys=True) + "\n" for q in found))
    return found


def kept_away(run_dir: Path, job: str) -> list[Quarantine]:
    """Every node `job` has kept away, the latest record of each, oldest first (expired ones too)."""
    latest: dict[str, Quarantine] = {}
    for row in read_json_lines(run_dir / QUARANTINE, "node", str):
        try:
            when, until = float(str(row["time"])), float(str(row["until"]))
        except (KeyError, ValueError):
            continue
        found = Quarantine(str(row["node"]), str(row.get("why", "")), str(row.get("job", "")), when, until)
        if found.job == job:
            latest.pop(found.node, None)
            latest[found.node] = found
    return list(latest.values())


def active_quarantines(run_dir: Path, job: str, now: float) -> list[Quarantine]:
    """The nodes `job` keeps away at `now` (`kept_away`'s records not yet expired), oldest first."""
    return [q for q in kept_away(run_dir, job) if q.active(now)]


def exclusion(current: Iterable[str], records: Iterable[Quarantine], now: float) -> list[str]:
    """The job's node exclusion from now on: what it excludes already (`current`: the user's own
    exclusions and earlier quarantines) with the active quarantines added and the expired ones
    dropped, in a stable order."""
    records = list(records)
    expired = {q.node for q in records if not q.active(now)}
    active = [q.node for q in records if q.active(now)]
    return list(dict.fromkeys([n for n in current if n not in expired] + active))
