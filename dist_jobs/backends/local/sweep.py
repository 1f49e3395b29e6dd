"""A local sweep: K trials at a time, each a local job, under a detached driver; every trial
runs from one snapshot of the code taken at submit (a driver starts trials later: each must not
take a copy of its own), unless the spec says `snapshot: false`.

`dist-jobs sweep --backend local --max-parallel K` writes the manifest (with every trial's
spec) and starts `python -m dist_jobs sweep --drive MANIFEST` in a session of its own, so it
outlives the shell, as `submit --backend local` does for one job. The driver submits a trial
whenever fewer than K run, until all have been started and have ended; its output goes to
`driver.log` beside the manifest, its pid to `driver.pid`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from dist_jobs.backends.base import run_dir_of
from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.backends.snapshot import spec_in_copy
from dist_jobs.backends.sweeps import MANIFEST, PreparedSweep, prepare_each, write_manifest
from dist_jobs.errors import DistJobsError, Problem
from dist_jobs.spec import JobSpec
from dist_jobs.spec.load import load_spec


class LocalSweeps:
    snapshots = True

    def problems(self, max_parallel: int | None) -> list[Problem]:
        return []

    def trial_overrides(self, name: str, index: int) -> dict[str, str]:
        return {}

    def snapshot(self, base: JobSpec, options: Mapping[str, Any]) -> JobSpec:
        code = Path(options.get("workdir") or Path.cwd())  # the folder the trials would start in
        return spec_in_copy(base, code, run_dir_of(base, code).root.resolve() / base.name)

    def prepare(
        self, name: str, params: list[dict[str, Any]], specs: list[JobSpec], max_parallel: int | None, **options: Any
    ) -> PreparedSweep:
        payloads = prepare_each("local", specs, **options)
        text = "".join(f"# trial {i}: {s.run_id}\n{p}" for i, (s, (_, p)) in enumerate(zip(specs, payloads)))
        return PreparedSweep(name, "local", params, specs, payloads, None, max_parallel, text)

    def roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        root = run_dir_of(first, here).root  # the trials' run directories are below it
        return root, str(root)

    def submit(self, plan: PreparedSweep, manifest: dict[str, Any], root: Path, **options: Any) -> list[str]:
        if plan.max_parallel and plan.max_parallel < len(plan.specs):
            manifest["specs"] = [msgspec.to_builtins(s) for s in plan.specs]
            manifest["trials"] = [{**t, "handle": f"local://{t['run_dir']}"} for t in manifest["trials"]]
            write_manifest(root, manifest)
            start_driver(root / MANIFEST, options)
            return [t["handle"] for t in manifest["trials"]]
        local = LocalBackend(**options)
        return [str(local.submit(trial)) for trial in plan.trials()]

    def attach_options(self, saved: Mapping[str, str]) -> dict[str, Any]:
        return {}

    def cancel(self, folder: Path, handles: list[str], options: Mapping[str, Any]) -> list[str] | None:
        stop_driver(folder)  # no trial starts any more; those running are cancelled one by one
        return None

    def not_started(self, run_dir: str) -> bool:
        return not (Path(run_dir) / "local" / "pid").exists()


def start_driver(manifest: Path, options: Mapping[str, Any]) -> None:
    argv = [sys.executable, "-m", "dist_jobs", "sweep", "--drive", str(manifest)]
    with (manifest.parent / "driver.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=options.get("workdir") or Path.cwd(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (manifest.parent / "driver.pid").write_text(f"{proc.pid}\n")


def drive_local(manifest_path: Path, poll: float = 1.0) -> int:
    """The detached driver of a local sweep: keeps `max_parallel` trials running until all have run."""
    manifest = json.loads(manifest_path.read_text())
    workdir = Path(manifest["options"].get("workdir") or Path.cwd())
    jobs = LocalBackend(workdir=workdir)
    pending = [load_spec(data=raw) for raw in manifest["specs"]]
    running: list[str] = []
    while pending or running:
        running = [r for r in running if not _finished(jobs, r)]
        while pending and len(running) < manifest["max_parallel"]:
            spec = pending.pop(0)
            try:
                running.append(jobs.submit(jobs.prepare(spec)).job_id)
            except DistJobsError as exc:  # one trial that cannot start must not stop the others
                print(f"dist-jobs sweep: trial {spec.run_id} not started: {exc}", flush=True)
        time.sleep(poll)
    return 0


def stop_driver(folder: Path) -> bool:
    """SIGTERM the sweep's driver (so no further trial starts); False when none runs."""
    try:
        pid = int((folder / "driver.pid").read_text().strip())
        if b"--drive" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False  # ended, and the pid is someone else's now
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return False
    return True


def _finished(jobs: LocalBackend, job_id: str) -> bool:
    try:
        return bool(jobs.status(job_id).finished)
    except DistJobsError:
        return True


SWEEPS = LocalSweeps()
