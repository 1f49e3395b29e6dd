"""What sbatch prints (Slurm 22.05), as pure functions: the job id, a `--test-only` estimate, and
errors turned into a BackendError that says what went wrong and what to do. Tested against output
captured from a real cluster (tests/fixtures/slurm/, see its INDEX.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from dist_jobs.errors import BackendError


def parse_sbatch_job_id(stdout: str) -> str:
    """The job id from `sbatch --parsable`: `123` or `123;cluster` (multi-cluster)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    job_id = lines[-1].split(";", 1)[0] if lines else ""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise BackendError(
            f"sbatch --parsable printed no job id (stdout: {stdout.strip()!r})",
            "run the same sbatch by hand to see its messages",
        )
    return job_id


@dataclass(frozen=True)
class SbatchTestOnly:
    """What `sbatch --test-only` predicts (it prints this on stderr, exit 0)."""

    job_id: str
    start: datetime | None  # None when the estimate is not a usable date (22.05 can print year 10193)
    cpus: int
    nodelist: str
    partition: str


_TEST_ONLY = re.compile(r"Job (\d+) to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)")


def parse_sbatch_test_only(stderr: str) -> SbatchTestOnly:
    match = _TEST_ONLY.search(stderr)
    if not match:
        raise BackendError(
            f"sbatch --test-only printed no estimate: {stderr.strip()!r}",
            "the job cannot run as asked; see sbatch's message",
        )
    job_id, start, cpus, nodelist, partition = match.groups()
    try:
        when: datetime | None = datetime.fromisoformat(start)
    except ValueError:
        when = None
    return SbatchTestOnly(job_id, when, int(cpus), nodelist, partition)


# (pattern in sbatch's stderr, what it means, what to do). First match wins; the more specific
# client-side messages come before the controller's generic "submission failed" reasons.
# What every SLURM client prints when slurmctld does not answer (after its own retries).
CONTROLLER_UNREACHABLE = (
    r"Unable to contact slurm controller|Could not establish a configuration source|"
    r"Zero Bytes were transmitted or received"
)
CONTROLLER_HINT = "check `scontrol ping` and `sinfo`; for the local test cluster run `bash slurm/cluster/up.sh`"
_SBATCH_ERRORS: tuple[tuple[str, str, str], ...] = (
    (CONTROLLER_UNREACHABLE, "sbatch cannot reach the SLURM controller (slurmctld)", CONTROLLER_HINT),
    (
        r"Munge encode failed|Protocol authentication error|Invalid authentication credential",
        "sbatch cannot authenticate to SLURM: munge failed (is munged running?)",
        "check `munge -n | unmunge`; for the local test cluster run `bash slurm/cluster/up.sh`",
    ),
    (
        r"invalid partition specified: (?P<partition>\S+)|Invalid partition name specified",
        "SLURM has no partition {partition!r}",
        "run `sinfo -s` to list the partitions and set `slurm.partition` in the job spec to one of them",
    ),
    (
        r"Node count specification invalid",
        "SLURM rejected the node count: more nodes than the partition has{nodes_note}",
        "run `sinfo -N` to see the nodes; lower `nodes` in the job spec",
    ),
    (
        r"More processors requested than permitted",
        "SLURM rejected the job: more CPUs/tasks requested than the nodes have{nodes_note}",
        "run `sinfo -N -o '%N %c'` to see CPUs per node; lower `procs_per_node` or `cpus_per_task`",
    ),
    (
        r"(?P<detail>Memory specification can not be satisfied|CPU count per node can not be satisfied)",
        "SLURM rejected the job: {detail}",
        "run `sinfo -N -o '%N %c %m'` to see each node's CPUs and memory (MB); "
        "ask for less (`memory`, `cpus_per_task`)",
    ),
    (
        r"Invalid generic resource \(gres\) specification",
        "SLURM rejected the GPU request: this cluster (or partition) has no such generic resource (gres)",
        "run `sinfo -o '%P %G'` to see each partition's GPUs; set `gpus_per_node` to what is there (0 without "
        "GPUs, with `procs_per_node`), or `slurm.gpus_flag: gres` where the site wants --gres=gpu:N",
    ),
    (
        r"Requested node configuration is not available",
        "SLURM has no nodes matching the request (node count, CPUs, memory, GPUs or features){nodes_note}",
        "run `sinfo -N -o '%N %c %m %G %f'` to see what the nodes offer, then ask for at most that "
        "(`nodes`, `procs_per_node`, `memory`, `gpus_per_node`)",
    ),
    (
        r"Invalid --time specification|Requested time limit is invalid",
        "SLURM rejected the time limit",
        "write `time` as minutes, MM:SS, HH:MM:SS or D-HH:MM:SS (e.g. 1-00:00:00); "
        "`sinfo -o '%P %l'` shows each partition's limit",
    ),
    (
        r"Invalid account",
        "SLURM rejected the account (or this account may not use the partition)",
        "run `sacctmgr show assoc user=$USER format=account,partition` and set `slurm.account` to one listed",
    ),
    (
        r"Invalid qos",
        "SLURM rejected the QOS",
        "run `sacctmgr show assoc user=$USER format=account,qos` and set `slurm.qos` to one listed",
    ),
    (
        r"Job violates accounting/QOS policy",
        "SLURM rejected the job: it breaks an accounting/QOS limit (job count, size or time)",
        "run `sacctmgr show qos` to see the limits; ask for less or wait for jobs to finish",
    ),
    (
        r"Unable to open file|This does not look like a batch script|Batch script is empty",
        "sbatch could not read a batch script",
        "check that the script exists, is readable and starts with #!/bin/bash",
    ),
)


def sbatch_error(stderr: str, returncode: int, *, cluster_nodes: int | None = None) -> BackendError:
    """A BackendError explaining a failed sbatch; `cluster_nodes` adds "this cluster has N nodes"."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    nodes_note = f" (this cluster has {cluster_nodes} nodes)" if cluster_nodes else ""
    for pattern, message, hint in _SBATCH_ERRORS:
        match = re.search(pattern, stderr, flags=re.IGNORECASE)
        if match:
            values = {"partition": "?", "detail": "", **{k: v for k, v in match.groupdict().items() if v}}
            text = message.format(nodes_note=nodes_note, **values)
            return BackendError(f"{text}. sbatch said: {_said(lines)}", hint)
    return BackendError(
        f"sbatch failed with exit code {returncode}: {_said(lines) or '(no message)'}",
        "run the same sbatch command by hand to see its full output",
    )


def _said(lines: list[str]) -> str:
    """sbatch's own words, without the repeated `sbatch: error:` prefixes."""
    return " / ".join(re.sub(r"^sbatch: (error: )?", "", line) for line in lines)


def check_controller(stderr: str) -> None:
    """A failed squeue that could not reach slurmctld raises; any other failure means "not listed"."""
    if re.search(CONTROLLER_UNREACHABLE, stderr, re.IGNORECASE):
        said = stderr.strip()
        raise BackendError(f"squeue cannot reach the SLURM controller (slurmctld): {said}", CONTROLLER_HINT)
