"""`dist-jobs list/status/cancel/logs --backend slurm` against `python -c "import yaml"` plus the
scheduler commands the verb runs, on a live SLURM cluster (slurm/cluster/up.sh).

    python bench/bench_cli_verbs.py [--runs 21]

Every command is a fresh process, interleaved round by round so machine load hits all alike.
The baseline of a verb is the median of `python -c "import yaml"` plus the medians of the
scheduler commands it runs, with the same arguments:
- list: `squeue --noheader --user <me> --format ...`;
- status of a finished job: `squeue --jobs <id> --Format ...` (it is gone), then `sacct ...`;
- cancel: `scancel --verbose <id>` of a held job, submitted for the round (not timed);
- logs of a job submitted by dist-jobs (its job.json names the log folder): no scheduler command.
Budget: each verb's median wall time at most BUDGET_MS (150 ms, issue 25); the ratio to its
baseline is shown too (with other sessions loading the machine, also the ratio of minimums). The
exit code is 1 when a verb is over budget. The bench submits held `true` jobs to the cluster:
run it under the test-tier lock (`flock /tmp/dj-tier.lock python bench/bench_cli_verbs.py`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dist_jobs.backends.slurm.squeue_sacct import SACCT_FIELDS, SQUEUE_FORMAT, SQUEUE_FORMAT_LONG  # noqa: E402

# The children import this checkout, from bytecode as an installed package would (an inherited
# PYTHONDONTWRITEBYTECODE would make every run compile dist_jobs from source); the .pyc files go
# to a folder of the bench's own, not into the checkout.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV.update(PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=tempfile.mkdtemp(prefix="bench-cli-pyc-"))


def dist_jobs() -> list[str]:
    """The console script next to this interpreter (what users run), else `python -m dist_jobs`."""
    script = Path(sys.executable).parent / "dist-jobs"
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-m", "dist_jobs"]


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - start


def submit_held() -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--job-name", "bench-cli", "--output", "/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip().split(";")[0]


def finished_job() -> str:
    """A job that has ended: submitted, cancelled, and waited for until squeue forgets it."""
    job = submit_held()
    subprocess.run(["scancel", job], check=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = subprocess.run(["squeue", "--noheader", "--jobs", job], capture_output=True, text=True).stdout
        if not listed.strip():
            return job
        time.sleep(1)
    raise SystemExit(f"squeue still lists job {job} after 120 s (MinJobAge?)")


def logs_fixture(folder: Path, job: str) -> Path:
    """A jobs folder as `dist-jobs submit` leaves it, with one attempt's log of rank 0."""
    logs = folder / "logs"
    logs.mkdir(parents=True)
    (logs / f"bench-{job}-attempt1-rank0.out").write_text("".join(f"line {i}\n" for i in range(200)))
    (folder / "jobs" / f"bench-{job}").mkdir(parents=True)
    meta = {"log_dir": str(logs), "run": "bench", "launcher": "srun"}
    (folder / "jobs" / f"bench-{job}" / "job.json").write_text(json.dumps(meta))
    return folder / "jobs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    done = finished_job()
    work = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    try:
        jobs_dir = logs_fixture(work, done)
        cli = dist_jobs()
        fixed = {
            "import yaml": [sys.executable, "-c", "import yaml"],
            "squeue (list)": ["squeue", "--noheader", "--user", getpass.getuser(), "--format", SQUEUE_FORMAT],
            "squeue (status)": ["squeue", "--noheader", "--jobs", done, "--Format", SQUEUE_FORMAT_LONG],
            "sacct (status)": [
                "sacct",
                "--parsable2",
                "--noheader",
                "--duplicates",
                "--jobs",
                done,
                "--format",
                SACCT_FIELDS,
            ],
            "list": [*cli, "list", "--backend", "slurm"],
            "status": [*cli, "status", "--backend", "slurm", done],
            "logs": [*cli, "logs", "--backend", "slurm", "--jobs-dir", str(jobs_dir), done],
        }
        times = measure(fixed, cli, args.runs)
        over = report(times, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ENV["PYTHONPYCACHEPREFIX"], ignore_errors=True)
    if over:
        sys.exit(f"over the {BUDGET_MS} ms budget: {', '.join(over)}")


def measure(fixed: dict[str, list[str]], cli: list[str], runs: int) -> dict[str, list[float]]:
    for argv in fixed.values():  # warm the page cache and .pyc files
        wall(argv)
    times: dict[str, list[float]] = {name: [] for name in [*fixed, "scancel", "cancel"]}
    for _ in range(runs):
        for name, argv in fixed.items():
            times[name].append(wall(argv))
        held = [submit_held(), submit_held()]  # one for each cancel, not timed
        times["scancel"].append(wall(["scancel", "--verbose", held[0]]))
        times["cancel"].append(wall([*cli, "cancel", "--backend", "slurm", held[1]]))
    return times


def report(times: dict[str, list[float]], runs: int) -> list[str]:
    """Print the table; the verbs over budget."""
    print(f"{runs} interleaved runs each, {os.cpu_count()} CPUs: median (minimum)")
    for name, values in times.items():
        print(f"  {name:16s} {statistics.median(values) * 1000:7.1f} ms ({min(values) * 1000:.1f})")
    print("| verb | dist-jobs | budget | import yaml + scheduler command(s) | ratio of medians | of minimums |")
    print("|---|---|---|---|---|---|")
    over = []
    for verb, parts in FLOORS.items():
        med = {name: statistics.median(values) for name, values in times.items()}
        low = {name: min(values) for name, values in times.items()}
        floor, floor_low = sum(med[p] for p in parts), sum(low[p] for p in parts)
        verdict = "ok" if med[verb] * 1000 <= BUDGET_MS else "OVER"
        over += [verb] if verdict == "OVER" else []
        print(
            f"| {verb} | {med[verb] * 1000:.1f} ms | <= {BUDGET_MS} ms: {verdict} | {floor * 1000:.1f} ms "
            f"| {med[verb] / floor:.2f}x | {low[verb] / floor_low:.2f}x |"
        )
    return over


BUDGET_MS = 150  # a query verb's median wall time, scheduler command included (issue 25)
# What each verb's baseline is made of (the scheduler commands it runs).
FLOORS = {
    "list": ["import yaml", "squeue (list)"],
    "status": ["import yaml", "squeue (status)", "sacct (status)"],
    "cancel": ["import yaml", "scancel"],
    "logs": ["import yaml"],
}


if __name__ == "__main__":
    main()
