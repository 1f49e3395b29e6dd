"""A request too big for the cluster, told with the cluster's own numbers (pure).

sbatch's words for a request no node can hold are vague and often wrong about the cause: 3 nodes
on a 2-node cluster reads "More processors requested than permitted". After a rejection the
backend asks `sinfo --Node --format SINFO_FORMAT` and this module names the limit that was passed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from dist_jobs.errors import BackendError

if TYPE_CHECKING:  # `dist-jobs status` imports this module and must not load the spec classes
    from dist_jobs.spec import JobSpec

SINFO_FORMAT = "%N|%c|%m|%P"  # node, CPUs, memory (MB), partitions (the default one ends in '*')
# sbatch's words for a request no node (or not enough nodes) can hold: only then is sinfo asked.
TOO_BIG = re.compile(
    r"More processors requested|Node count specification invalid|node configuration is not available|"
    r"Memory specification can not be satisfied|CPU count per node can not be satisfied",
    re.IGNORECASE,
)
_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def memory_mb(text: str) -> float | None:
    """sbatch's --mem value in MB (`64G`, `4000`, `500M`); None if unreadable."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", text.strip().upper())
    return float(match.group(1)) * _UNITS[match.group(2) or "M"] if match else None


def _nodes(sinfo: str, partition: str | None) -> dict[str, tuple[int, int]]:
    """{node: (CPUs, memory MB)} of the partition asked for (else the default one)."""
    out: dict[str, tuple[int, int]] = {}
    for line in sinfo.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        name, cpus, mem, part = parts
        if (partition and part.rstrip("*") == partition) or (not partition and part.endswith("*")):
            out[name] = (int(cpus), int(mem))
    return out


def too_big(spec: JobSpec, sinfo: str) -> BackendError | None:
    """The limit `spec` passes on this cluster, with both numbers; None when it fits (or unknown)."""
    partition = spec.slurm.partition
    nodes = _nodes(sinfo, partition)
    if not nodes:
        return None
    where = f"partition {partition}" if partition else "the default partition"
    problems, hints = [], []
    if spec.nodes > len(nodes):
        problems.append(f"nodes: {spec.nodes} requested, {where} has {len(nodes)}")
        hints.append(f"nodes: {len(nodes)} or fewer")
    cpus = spec.procs * spec.cpus_per_task
    most = max(c for c, _ in nodes.values())
    if cpus > most:
        problems.append(
            f"CPUs per node: {spec.procs} processes x {spec.cpus_per_task} cpus_per_task = {cpus}, "
            f"the largest node has {most}"
        )
        hints.append(f"procs_per_node x cpus_per_task <= {most}")
    wanted, mem = memory_mb(spec.memory) if spec.memory else None, max(m for _, m in nodes.values())
    if wanted is not None and wanted > mem:
        problems.append(f"memory: {spec.memory} per node ({wanted:.0f} MB), the largest node has {mem} MB")
        hints.append(f"memory: {mem}M or less")
    if not problems:
        return None
    return BackendError("the job is too big for this cluster: " + "; ".join(problems), "ask for " + ", ".join(hints))
