"""`dist-jobs logs` on Kubernetes as on the local and SLURM backends: every rank's lines, each
`[rank N] ...`, or one rank's lines without the prefix.

A pod of one process (k8s.launch: direct) is its rank. A pod running torchrun holds several
ranks: torchrun prefixes each worker line with `[rank R] ` (PET_LOG_LINE_PREFIX_TEMPLATE,
dist_jobs.spec.env), R the global rank, so a rank's lines are found by R, never by the pod (an
elastic job's ranks follow the rendezvous, not the pod names). torchrun's own and the pod
entrypoint's lines belong to no rank: they are told `[node P] ...`, P the pod rank.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dist_jobs.backends.k8s.kinds import JobKind
from dist_jobs.backends.k8s.ranks import waiting_reason

PREFIX_ENV = "PET_LOG_LINE_PREFIX_TEMPLATE"
_RANK_LINE = re.compile(r"\[rank \d+\] ")


@dataclass(frozen=True)
class PodLog:
    """One container run of a pod: its pod rank, name, container, and a key that changes when the
    pod is replaced or its container restarts (a new log to read)."""

    rank: int
    name: str
    container: str
    key: str


def labelled(line: str, pod: int, torchrun: bool) -> str:
    if not torchrun:
        return f"[rank {pod}] {line}"
    return line if _RANK_LINE.match(line) else f"[node {pod}] {line}"


def of_rank(lines: Iterator[tuple[int, str]], rank: int) -> Iterator[str]:
    mine = f"[rank {rank}] "
    return (line[len(mine) :] for _, line in lines if line.startswith(mine))


def pod_logs(pods: list[dict[str, Any]], kind: JobKind, job: dict[str, Any]) -> list[PodLog]:
    """The pods of `job` that have a log, by pod rank; of a rank's pods the newest live one (a
    replaced pod can briefly coexist with its terminating predecessor)."""
    best: dict[int, dict[str, Any]] = {}
    for pod in pods:
        rank = kind.rank_of(pod, job)
        if rank is None or waiting_reason(pod, kind.container) is not None:
            continue
        held = best.get(rank)
        if held is None or _newer(pod) > _newer(held):
            best[rank] = pod
    return [_pod_log(rank, best[rank], kind.container) for rank in sorted(best)]


def _newer(pod: dict[str, Any]) -> tuple[bool, str]:
    return "deletionTimestamp" not in pod["metadata"], pod["metadata"].get("creationTimestamp") or ""


def _pod_log(rank: int, pod: dict[str, Any], container: str) -> PodLog:
    meta = pod["metadata"]
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarts = next((s.get("restartCount", 0) for s in statuses if s.get("name") == container), 0)
    key = f"{meta['name']}/{meta.get('uid') or meta.get('creationTimestamp') or ''}/{restarts}"
    return PodLog(rank, meta["name"], container, key)


def followed(
    listed: Callable[[], list[PodLog]],
    stream: Callable[[PodLog], Iterator[str]],
    finished: Callable[[], bool],
    poll_s: float = 1.0,
) -> Iterator[tuple[int, str]]:
    """(pod rank, line) of every pod as the lines come, pods that start or restart later included,
    until the job has finished and every stream has ended."""
    lines: queue.Queue[tuple[int, str] | None] = queue.Queue()
    started: set[str] = set()
    live = 0
    while True:
        done = finished()  # asked before listing: a pod listed after the end is still read
        for log in listed():
            if log.key not in started:
                started.add(log.key)
                live += 1
                threading.Thread(target=_pump, args=(log, stream, lines), daemon=True).start()
        deadline = time.monotonic() + poll_s
        while (left := deadline - time.monotonic()) > 0 or (done and live):
            try:
                item = lines.get(timeout=max(left, 0.05))
            except queue.Empty:
                continue
            if item is None:
                live -= 1
            else:
                yield item
        if done and not live:
            return


def _pump(log: PodLog, stream: Callable[[PodLog], Iterator[str]], lines: queue.Queue[tuple[int, str] | None]) -> None:
    try:
        for line in stream(log):
            lines.put((log.rank, line))
    except Exception:  # a pod deleted while followed: its replacement is listed and read anew
        pass
    finally:
        lines.put(None)
