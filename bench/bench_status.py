"""`dist-jobs status HANDLE` vs asking SLURM directly (`sacct -j ID` then `squeue -j ID`).

    .venv/bin/python bench/bench_status.py [--repeats 20]

Needs the local cluster (bash slurm/cluster/up.sh). Submits two small jobs with dist-jobs: one
that stays running (`sleep`) and one that has ended and left squeue (MinJobAge), so both paths
of `status` are measured: squeue alone (running) and squeue + sacct + the batch log (ended).

Measured: the wall clock (`time.monotonic()`) of each complete command as a subprocess, from
start to exit, output captured: `dist-jobs status slurm://CLUSTER/ID` (the console script; the interpreter
start and imports included, as a user pays them) against `sacct -j ID` followed by `squeue -j ID`
(two processes, what a user types to learn the same). Runs alternate (baseline, dist-jobs, ...);
medians are compared. Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# dist-jobs runs from bytecode, as an installed package does: an inherited PYTHONDONTWRITEBYTECODE
# would make every run compile dist_jobs from source. The .pyc files go to a folder of the bench's.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=tempfile.mkdtemp(prefix="bench-status-pyc-"))


def dist_jobs() -> list[str]:
    """The console script next to this interpreter (what users run), else `python -m dist_jobs`."""
    script = Path(sys.executable).parent / "dist-jobs"
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-m", "dist_jobs"]


def _timed(argvs: list[list[str]], cwd: Path) -> float:
    start = time.monotonic()
    for argv in argvs:
        subprocess.run(argv, cwd=cwd, capture_output=True, check=False, env=ENV)
    return time.monotonic() - start


def _submit(root: Path, name: str, command: list[str]) -> str:
    spec = root / f"{name}.yaml"
    data = {"name": name, "nodes": 1, "procs_per_node": 1, "time": "10", "log_dir": str(root / "logs")}
    spec.write_text(yaml.safe_dump({**data, "checkpoint_dir": str(root / "checkpoints")}))
    argv = [sys.executable, "-m", "dist_jobs", "submit", "--backend", "slurm", str(spec), "--", *command]
    out = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _gone_from_squeue(job_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "--noheader", "-j", job_id], capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(1)
    raise SystemExit(f"job {job_id} still in squeue after {timeout} s")


def measure(root: Path, handle: str, repeats: int) -> dict[str, object]:
    job_id = handle.rsplit("/", 1)[1]
    ours = [[*dist_jobs(), "status", handle]]
    base = [["sacct", "-j", job_id], ["squeue", "-j", job_id]]
    _timed(ours, root), _timed(base, root)  # warm the page cache once each
    times: dict[str, list[float]] = {"baseline": [], "dist-jobs": []}
    for _ in range(repeats):
        times["baseline"].append(_timed(base, root))
        times["dist-jobs"].append(_timed(ours, root))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "baseline_median_s": round(med["baseline"], 4),
        "dist_jobs_median_s": round(med["dist-jobs"], 4),
        "ratio": round(med["dist-jobs"] / med["baseline"], 2),
        "repeats": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="interleaved runs of each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-", dir="/tmp") as folder:
        root = Path(folder)
        ended = _submit(root, "bench-ended", ["true"])
        running = _submit(root, "bench-running", ["sleep", "600"])
        try:
            _gone_from_squeue(ended.rsplit("/", 1)[1])
            for case, handle in (("running (squeue)", running), ("ended (squeue, sacct, batch log)", ended)):
                print(json.dumps({"case": case, **measure(root, handle, args.repeats)}), flush=True)
        finally:
            subprocess.run(["scancel", running.rsplit("/", 1)[1]], capture_output=True)


if __name__ == "__main__":
    main()
