"""Per-rank detail of a Kubernetes job from its pods' container statuses (pure, on dicts as the
apiserver returns them): which rank failed first, with which exit code or signal.

A pod's rank is what its job's kind says it is (kinds.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.jobstate import describe_exit
from dist_jobs.backends.k8s.kinds import JobKind


def _container(pod: dict[str, Any]) -> tuple[str, str]:
    """(what the main container says, when it ended or '') from its current or last state."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not statuses:
        return (pod.get("status") or {}).get("phase", "Pending").lower(), ""
    state, last = statuses[0].get("state") or {}, statuses[0].get("lastState") or {}
    ended = state.get("terminated") or last.get("terminated")
    if "waiting" in state and not ended:
        return f"waiting: {state['waiting'].get('reason', '?')}", ""
    if "running" in state and not state.get("terminated"):
        return "running", ""
    if not ended:
        return "unknown", ""
    what = describe_exit(ended.get("exitCode"), ended.get("signal"))
    if ended.get("reason") not in (None, "Completed", "Error"):
        what += f" ({ended['reason']})"  # OOMKilled, ContainerCannotRun, ...
    return what, str(ended.get("finishedAt") or "") if ended.get("exitCode") else ""


def rank_detail(pods: list[dict[str, Any]], kind: JobKind, job: dict[str, Any]) -> tuple[dict[int, str], str]:
    """({rank: what its container says}, 'rank R failed first: ...' or ''), of the pods of `job`."""
    ranks: dict[int, str] = {}
    failures: list[tuple[str, int]] = []
    for pod in pods:
        rank = kind.rank_of(pod, job)
        if rank is None:
            continue
        what, failed_at = _container(pod)
        ranks[rank] = what
        if failed_at:
            failures.append((failed_at, rank))
    first = min(failures)[1] if failures else None
    return ranks, (f"rank {first} failed first: {ranks[first]}" if first is not None else "")


def with_ranks(status: JobStatus, pods: list[dict[str, Any]], kind: JobKind, job: dict[str, Any]) -> JobStatus:
    """`status` with each rank's container state; a failed rank's story replaces a bare message."""
    ranks, first = rank_detail(pods, kind, job)
    detail = f"{first}; {status.detail}" if first and status.detail else (first or status.detail)
    return dataclasses.replace(status, detail=detail, ranks=ranks)


def waiting_reason(pod: dict[str, Any], container: str) -> str | None:
    """Why the pod has no log yet (Pending, ContainerCreating, ...), or None when it has one."""
    status = pod.get("status") or {}
    for state in status.get("containerStatuses") or []:
        if state.get("name") == container:
            waiting = (state.get("state") or {}).get("waiting")
            ran_before = (state.get("lastState") or {}).get("terminated")  # a restarted container has a log
            return None if ran_before or waiting is None else str(waiting.get("reason") or "Waiting")
    if status.get("phase") == "Pending":
        unscheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
        reason = unscheduled[0].get("reason") if unscheduled and unscheduled[0].get("status") == "False" else None
        return f"Pending{f' ({reason})' if reason else ''}"
    return None


def job_status(obj: dict[str, Any]) -> JobStatus:
    """Latest true condition as the state; per-replica (or per-Job) pod counts as extras."""
    meta, status = obj["metadata"], obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    latest = conditions[-1] if conditions else {}
    state, detail = latest.get("type", "Pending"), latest.get("message", "")
    if meta.get("deletionTimestamp"):
        state, detail = "Terminating", f"deleted at {meta['deletionTimestamp']}; its pods are being removed"
    counts = dict(status.get("replicaStatuses") or {})  # PyTorchJob: {Master: {active: 1}, ...}
    counts.update({j.get("name", "?"): j for j in status.get("jobsStatus") or []})  # TrainJob: [{name, active}]
    extra = {name: _counts(c) for name, c in counts.items() if isinstance(c, dict)}
    return JobStatus(meta["name"], meta["name"], state, detail, extra)


def _counts(counts: dict[str, Any]) -> str:
    # replicaStatuses also carries label selectors: keep the pod counts only
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()) if isinstance(v, int) and not isinstance(v, bool))
