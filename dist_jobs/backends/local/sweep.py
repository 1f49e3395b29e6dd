"""A local sweep: K trials at a time, each a local job, under a detached driver; every trial
runs from one snapshot of the code taken at submit (a driver starts trials later: each must not
take a copy of its own), unless the spec says `snapshot: false`.

`dist-jobs sweep --backend local --max-parallel K` writes every trial's spec to `driver.json`
beside the manifest and starts `python -m dist_jobs.backends.local.sweep --drive driver.json` in a
session of its own, so it outlives the shell, as `submit --backend local` does for one job. The
driver submits a trial whenever fewer than K run, until all have been started and have ended;
its output goes to `driver.log` beside the manifest, its pid and start time to `driver.pid`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from dist_jobs.backends import Backend, get_backend
from dist_jobs.backends.base import PreparedSweep
from dist_jobs.backends.local.record import Started
from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.atomic import write_atomic
from dist_jobs.spec.load import load_spec

DRIVER = "driver.json"  # what the driver runs: the backend, its folder, K and every trial's spec


def submit_driven(
    plan: PreparedSweep, manifest: dict[str, Any], root: Path, local: Backend, workdir: Path
) -> list[str]:
    """The driver started on every trial's spec (its own file, driver.json): the trials' handles,
    their run directories' (the manifest is the API's to write)."""
    specs = [msgspec.to_builtins(s) for s in plan.specs]
    order = {"backend": local.name, "workdir": str(workdir), "max_parallel": plan.max_parallel, "specs": specs}
    write_atomic(root / DRIVER, json.dumps(order) + "\n", mkdir=True)
    start_driver(root / DRIVER, workdir)
    return [str(local.handle(t["run_dir"])) for t in manifest["trials"]]


def start_driver(order: Path, workdir: Path) -> None:
    argv = [sys.executable, "-m", "dist_jobs.backends.local.sweep", "--drive", str(order)]
    with (order.parent / "driver.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    Started.of(proc.pid).write(order.parent / "driver.pid")


def drive_local(order_path: Path, poll: float = 1.0) -> int:
    """The detached driver of a local sweep: keeps `max_parallel` trials running until all have run."""
    order = json.loads(order_path.read_text())
    jobs = get_backend(order["backend"], workdir=Path(order["workdir"]))
    pending = [load_spec(data=raw) for raw in order["specs"]]
    running: list[str] = []
    while pending or running:
        running = [r for r in running if not _finished(jobs, r)]
        while pending and len(running) < order["max_parallel"]:
            spec = pending.pop(0)
            try:
                running.append(jobs.submit(spec).job_id)
            except DistJobsError as exc:  # one trial that cannot start must not stop the others
                print(f"dist-jobs sweep: trial {spec.run_id} not started: {exc}", flush=True)
        time.sleep(poll)
    return 0


def stop_driver(folder: Path) -> bool:
    """SIGTERM the sweep's driver (so no further trial starts); False when none runs."""
    driver = Started.read(folder / "driver.pid")
    if driver is None or not driver.running():  # ended, or the pid is someone else's now
        return False
    try:
        os.kill(driver.pid, signal.SIGTERM)
    except ProcessLookupError:  # ended since
        return False
    return True


def _finished(jobs: Backend, job_id: str) -> bool:
    try:
        return bool(jobs.status(job_id).finished)
    except DistJobsError:
        return True


if __name__ == "__main__":  # the detached driver start_driver runs; the package never imports it as __main__
    sys.exit(drive_local(Path(sys.argv[sys.argv.index("--drive") + 1])))
