"""A backend that exists only in the tests: an in-memory queue, registered by this folder's
conftest. Nothing outside this folder names it, so it shows that the CLI, the API, handles,
logs and sweeps take any backend the registry lists."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import msgspec

from dist_jobs.backends import Backend, JobStatus, Option, Prepared, records
from dist_jobs.backends.base import run_dir_of
from dist_jobs.backends.handle import Handle
from dist_jobs.errors import BackendError
from dist_jobs.spec import JobSpec


@dataclass
class FakeJob:
    spec: JobSpec
    payload: str
    state: str = "RUNNING"
    lines: dict[int, list[str]] = field(default_factory=dict)


class FakeBackend(Backend):
    name = "fake"
    summary = "an in-memory queue"
    options = (Option("--fake-pool", "pool", "fake: the queue the job goes to (default: main)"),)
    handle_fields = ("pool",)
    handle_id = "N"
    queues: ClassVar[dict[str, dict[str, FakeJob]]] = {}  # by pool, then job id

    def __init__(self, pool: str = "main", cwd: Path | None = None) -> None:
        self.pool = pool
        self.cwd = cwd or Path.cwd()
        self.jobs = self.queues.setdefault(pool, {})

    @classmethod
    def parse_handle(cls, job_id: str, fields: dict[str, str]) -> Handle:
        if not job_id.isdigit():
            raise ValueError(f"{job_id!r} is no fake job number")
        return super().parse_handle(job_id, fields)

    def prepare(self, spec: JobSpec) -> Prepared:
        return Prepared(self.name, spec, json.dumps(msgspec.to_builtins(spec), sort_keys=True) + "\n", "job.json")

    def hand_over(self, prepared: Prepared) -> Handle:
        job_id = str(len(self.jobs) + 1)
        lines = {r: [f"hello from rank {r}", f"{prepared.spec.run_id} done"] for r in range(prepared.spec.world_size)}
        self.jobs[job_id] = FakeJob(prepared.spec, prepared.payload, lines=lines)
        return self.handle(job_id)

    def submitted(self, prepared: Prepared, handle: Handle) -> records.Submitted:
        return records.Submitted(self.name, handle.job_id, str(run_dir_of(prepared.spec, self.cwd)))

    def handle(self, job_id: str) -> Handle:
        return Handle(self.name, job_id, pool=self.pool)

    def _job(self, job_id: str) -> FakeJob:
        if job_id not in self.jobs:
            raise BackendError(f"the fake queue {self.pool} has no job {job_id}", "submit one first")
        return self.jobs[job_id]

    def status(self, job_id: str) -> JobStatus:
        job = self._job(job_id)
        return JobStatus(job_id, job.spec.run_id, job.state)

    def list(self) -> builtins.list[JobStatus]:
        return [JobStatus(i, j.spec.run_id, j.state, handle=str(self.handle(i))) for i, j in sorted(self.jobs.items())]

    def exists(self, job_id: str) -> bool:
        return not self.status(job_id).finished

    def stop(self, job_id: str) -> None:
        self._job(job_id).state = "CANCELLED"

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        lines = self._job(job_id).lines
        if rank is not None:
            yield from lines[rank]
            return
        yield from (f"[rank {r}] {line}" for r, each in sorted(lines.items()) for line in each)

    def run_dir(self, job_id: str) -> Path:
        return run_dir_of(self._job(job_id).spec, self.cwd).path

    def owner(self, job_id: str) -> str | None:
        return None

    def finish(self, job_id: str, state: str = "COMPLETED") -> None:
        """The test's part of the scheduler: the job ends."""
        self._job(job_id).state = state
