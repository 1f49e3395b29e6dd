"""A SLURM job whose nodes are still being cleaned up after it ended (pure; real captured output
in tests/fixtures/slurm/, see its INDEX.md).

squeue shows such a job as COMPLETING and lists only the nodes not yet released. That lasts a
second after a normal end, but a node that died (its slurmd gone) never answers: the job stays
COMPLETING, already requeued (sacct's allocation line says REQUEUED, squeue's RestartCnt went
up), until SlurmdTimeout marks the node DOWN, minutes later. No rank runs meanwhile, so "running"
and an ETA would both be wrong; sinfo says which node does not answer (`completing*`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.slurm.squeue_sacct import QueuedJob, SacctJobState
from dist_jobs.ranks.nodelist import expand

# For `sinfo --noheader --Node --nodes NODES --format SINFO_NODE_STATES`: one line per node.
SINFO_NODE_STATES = "%N|%T|%E|%H"
_NOT_RESPONDING = "*"  # sinfo's suffix on a node state: the node does not answer slurmctld


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's word with its suffix: idle, completing*, down*
    reason: str  # "none" unless an admin or slurmctld set one (Not responding once DOWN)
    since: str  # when the reason was set; "Unknown" without one

    @property
    def responding(self) -> bool:
        return not self.state.endswith(_NOT_RESPONDING)

    def told(self) -> str:
        if self.responding:
            return self.name
        since = f" since {self.since.replace('T', ' ')}" if self.since not in ("", "Unknown") else ""
        return f"{self.name} (not responding{since})"


def parse_node_states(stdout: str) -> dict[str, NodeState]:
    """Nodes by name from `sinfo --noheader --Node --format SINFO_NODE_STATES`; a node in
    several partitions is listed once per partition, with the same state."""
    nodes: dict[str, NodeState] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            nodes[parts[0]] = NodeState(*parts)
    return nodes


def completing_status(job: QueuedJob, acct: SacctJobState | None, nodes: Mapping[str, NodeState]) -> JobStatus:
    """squeue's COMPLETING job, told with sacct's latest attempt (`acct`: None when sacct could
    not say) and the state of its nodes (`nodes`: those of the allocation, sacct's, and those
    still completing, squeue's). squeue lists only the nodes not yet released: once SLURM has
    marked a dead node down it is released, and a live one (the batch host) may still be cleaned
    up; the node that failed is named as such, not as the one being cleaned up."""
    completing = expand(job.nodelist) if job.nodelist else list(nodes)
    failed = [n for n in nodes.values() if n.name not in completing and not n.responding]
    told = [nodes[n].told() if n in nodes else n for n in completing]
    where = ", ".join(told) or job.nodelist or "its nodes"
    lost = f"failed: {', '.join(n.told() for n in failed)}; " if failed else ""
    ended = acct.end.strftime("%Y-%m-%d %H:%M:%S") if acct is not None and acct.end is not None else None
    extra = {"nodes": job.nodelist, "restarts": "" if job.restarts is None else str(job.restarts)}
    if acct is not None and acct.state == "REQUEUED":
        restart = f" (restart {job.restarts})" if job.restarts else ""
        detail = (
            f"requeued{restart}{f' at {ended}' if ended else ''}; {lost}no rank runs: "
            f"waiting for SLURM to clean up {where} before the job can start again"
        )
        return JobStatus(job.job_id, job.name, job.state, detail, extra, normal="requeued")
    if acct is not None and ended and acct.state not in ("RUNNING", "PENDING"):
        detail = f"ended ({acct.state}) at {ended}; {lost}SLURM is still cleaning up {where}"
    else:
        detail = f"ending: {lost}SLURM is stopping the job on {where}"
    return JobStatus(job.job_id, job.name, job.state, detail, extra, normal="completing")
