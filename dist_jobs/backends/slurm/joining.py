"""What a SLURM job not ended waits for, added to its status: the ranks that have not joined
("waiting for ranks 2-3 on n2 to join for 1m40s") and the nodes it keeps away (they failed an
earlier attempt: dist_jobs.rundir.quarantine).

Before its first optimizer step a job shows no progress to measure, so a node that died before
it (or a rank that never started) leaves the job RUNNING to the scheduler while the ranks left
wait at the rendezvous. What the run's folders say about the step now running:
- the batch script's start stamp (`<log dir>/.<job>-attempt<label>.start`, removed once the
  step ends): which step runs, and since when;
- each task's log file of that step, which slurmstepd opens when it starts the task: a task
  without one has not started (its node did not run it);
- each rank's beat of this attempt, newer than the step's start (dist_jobs.rundir.beats): the
  rank joined and trains.
After JOIN_GRACE_S without every rank joined, the ranks that did not start are named, else (some
ranks beat) those that never beat, else (none did) those on a node the scheduler says does not
answer (a node that died after starting its tasks: the others wait at the rendezvous). Pure but
for reading those files and asking the caller about silent nodes.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.slurm.faults import SINFO_NODE_STATES, parse_node_states
from dist_jobs.ranks.nodelist import expand
from dist_jobs.rundir.beats import read_beats
from dist_jobs.rundir.progress import duration
from dist_jobs.rundir.quarantine import active_quarantines

JOIN_GRACE_S = 60.0  # a healthy rendezvous takes seconds; past this a missing rank is news


@dataclass(frozen=True)
class Step:
    label: str  # "1", "1.2": the batch script's attempt label
    started: float  # time.time() of its start stamp


def running_step(log_dir: Path, job_id: str) -> Step | None:
    """The step the batch script runs now (its start stamp), None between steps or without one."""
    pattern = re.compile(rf"\.{re.escape(job_id)}-attempt(\d+(?:\.\d+)?)\.start$")
    found = []
    for path in log_dir.glob(f".{job_id}-attempt*.start"):
        match = pattern.search(path.name)
        try:
            if match:
                found.append(Step(match.group(1), path.stat().st_mtime))
        except OSError:  # the step ended meanwhile
            continue
    return max(found, key=lambda s: s.started) if found else None


def ranks_told(ranks: Sequence[int]) -> str:
    """ "rank 2", "ranks 2-3", "ranks 0-1, 4": consecutive ranks as ranges."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    told = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {told}"


def waiting_for(missing: Sequence[int], nodes: Sequence[str], procs: int, seconds: float) -> str:
    """ "waiting for ranks 2-3 on n2 to join for 1m40s": the ranks grouped by node (rank r runs on
    node r // procs of the allocation, SLURM's block distribution)."""
    by_node: dict[str, list[int]] = {}
    for rank in missing:
        node = nodes[rank // procs] if procs > 0 and rank // procs < len(nodes) else "?"
        by_node.setdefault(node, []).append(rank)
    told = ", ".join(f"{ranks_told(ranks)} on {node}" for node, ranks in by_node.items())
    return f"waiting for {told} to join for {duration(seconds)}"


def not_joined(
    world: int, started: Collection[int], joined: Collection[int], silent: Collection[int] = ()
) -> list[int]:
    """The ranks the others wait for: those that did not start, else (some joined) those that did
    not join, else (none joined) those on a node that does not answer (`silent`); none when
    nothing tells them apart."""
    unstarted = [r for r in range(world) if r not in started]
    if unstarted:
        return unstarted
    if joined:
        return [r for r in range(world) if r not in joined]
    return sorted(silent)


def joining(
    run_dir: Path,
    log_dir: Path,
    run: str,
    job_id: str,
    layout: tuple[list[str], int, bool],
    now: float,
    silent_nodes: Callable[[], list[str]] = list,
) -> str:
    """The ranks of the running job not joined after JOIN_GRACE_S, told; "" when all joined, or
    before. `layout`: (the allocation's nodes, processes per node, torchrun mode: one task per
    node); `silent_nodes`: the allocation's nodes that do not answer the scheduler, asked only
    when no rank joined (a node that died after starting its tasks)."""
    nodes, procs, torchrun = layout
    step = running_step(log_dir, job_id)
    if step is None or now - step.started < JOIN_GRACE_S or procs <= 0:
        return ""
    world = len(nodes) * procs
    logs = re.compile(rf"{re.escape(run)}-{re.escape(job_id)}-attempt{re.escape(step.label)}-rank(\d+)\.out$")
    files = log_dir.glob(f"*-{job_id}-attempt{step.label}-rank*.out")
    tasks = {int(m.group(1)) for p in files if (m := logs.search(p.name))}
    started = {r for r in range(world) if (r // procs if torchrun else r) in tasks}
    attempt = int(step.label.split(".")[0])
    joined = {b.rank for b in read_beats(run_dir, world, job=job_id, attempt=attempt) if b.time >= step.started}
    silent = []
    if not joined and len(started) == world:
        gone = set(silent_nodes())
        silent = [r for r in range(world) if r // procs < len(nodes) and nodes[r // procs] in gone]
    missing = not_joined(world, started, joined, silent)
    return waiting_for(missing, nodes, procs, now - step.started) if missing else ""


def with_joining(
    run: Callable[[list[str]], subprocess.CompletedProcess[str]], job_id: str, status: JobStatus, meta: dict[str, Any]
) -> JobStatus:
    """A running job some of whose ranks have not joined after a while: which, where, for how
    long, in the detail. `meta`: the job's job.json; `run`: runs sinfo."""
    if status.state != "RUNNING" or not meta.get("run_dir") or not meta.get("log_dir") or "_" in job_id:
        return status
    nodelist = status.extra.get("nodes", "")

    def silent() -> list[str]:
        proc = run(["sinfo", "--noheader", "--Node", "--nodes", nodelist, "--format", SINFO_NODE_STATES])
        states = parse_node_states(proc.stdout) if proc.returncode == 0 else {}
        return [name for name, state in states.items() if not state.responding]

    nodes = expand(nodelist) if nodelist else []
    layout = (nodes, int(meta.get("procs_per_node") or 0), meta.get("launcher") == "torchrun")
    folders = Path(meta["run_dir"]), Path(meta["log_dir"])
    said = joining(*folders, meta.get("run", ""), job_id, layout, time.time(), silent)
    if not said:
        return status
    return dataclasses.replace(status, detail="; ".join(part for part in (status.detail, said) if part))


def with_quarantine(job_id: str, status: JobStatus, meta: dict[str, Any]) -> JobStatus:
    """A job not ended that keeps nodes away from its next attempts: which and why, in
    `kept_away` and the detail."""
    if not meta.get("run_dir") or status.finished:
        return status
    active = active_quarantines(Path(meta["run_dir"]), job_id, time.time())
    if not active:
        return status
    told = ", ".join(q.told() for q in active)
    detail = "; ".join(part for part in (status.detail, f"keeps away from {told}") if part)
    return dataclasses.replace(status, detail=detail, extra={**status.extra, "kept_away": told})
