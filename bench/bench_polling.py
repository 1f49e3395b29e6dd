"""Scheduler calls per poll of a 100-trial SLURM sweep, and `sweep status` against `squeue + sacct`.

    .venv/bin/python bench/bench_polling.py [--trials 100] [--repeats 15] [--repo CHECKOUT]

No cluster needed: stand-in `squeue` and `sacct` scripts first on PATH log each invocation and
print output in the captured Slurm 22.05 format (tests/fixtures/slurm/): one array job whose
first 5 tasks have ended (task 3 failed), 5 run and the rest pend. Measured:

- calls: `dist-jobs sweep status NAME` once, then one `Sweep.wait` poll in-process (`Sweep.status`,
  what each poll of `sweep --wait` runs), each with the scheduler calls the stand-ins logged;
- wall: the median of `--repeats` interleaved runs of `dist-jobs sweep status NAME` (a subprocess,
  start-up included) against `squeue --jobs ID` followed by `sacct --jobs ID` (two subprocesses,
  what a user types to see the same jobs). The stand-ins answer at once; where real `squeue` and
  `sacct` are on PATH, their time for the same two commands is printed too (real_squeue_sacct_s).

`--repo CHECKOUT`: run dist-jobs from another checkout (e.g. the commit before) for the before
figure. Prints one JSON line.
"""

from __future__ import annotations

import argparse
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
ARRAY = 500
STAMP = "2026-11-22T05:22:22"


def queue(trials: int) -> str:
    running = [
        f"{ARRAY}_{i}|RUNNING|None|1|n1|0:05|UNLIMITED|{STAMP}|{STAMP}|debug|0|sw" for i in range(5, min(10, trials))
    ]
    pending = [f"{ARRAY}_[10-{trials - 1}%10]|PENDING|JobArrayTaskLimit|1||0:00|UNLIMITED|{STAMP}|N/A|debug|0|sw"]
    return "\n".join(running + (pending if trials > 10 else [])) + "\n"


def accounting(trials: int) -> str:
    rows = []
    for i in range(min(5, trials)):
        state, code = ("FAILED", "3:0") if i == 3 else ("COMPLETED", "0:0")
        raw = ARRAY + 1 + i
        rows.append(f"{ARRAY}_{i}|{raw}|{state}|{code}|{STAMP}|{STAMP}|{STAMP}|00:00:09|1|n1|debug|sw")
        rows.append(f"{ARRAY}_{i}.batch|{raw}.batch|{state}|{code}|{STAMP}|{STAMP}|{STAMP}|00:00:09|1|n1||batch")
    return "\n".join(rows) + "\n"


def stand_ins(root: Path, trials: int) -> tuple[Path, Path]:
    """bin/squeue and bin/sacct: log `NAME ARGS` to calls.log, print the canned output."""
    bin_dir, log = root / "bin", root / "calls.log"
    bin_dir.mkdir()
    for name, text in (("squeue", queue(trials)), ("sacct", accounting(trials))):
        (root / f"{name}.out").write_text(text)
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\ncat "{root / f"{name}.out"}"\n')
        script.chmod(0o755)
    return bin_dir, log


def sweep(root: Path, trials: int) -> Path:
    """A submitted sweep's manifest, as `dist-jobs sweep --backend slurm` leaves it."""
    checkpoints = root / "ck"
    (checkpoints / "sw").mkdir(parents=True)
    rows = [
        {
            "index": i,
            "name": f"sw-t{i}",
            "params": {"train.lr": 0.1 / (i + 1)},
            "run_dir": str(checkpoints / "sw" / f"sw-t{i}"),
            "handle": f"slurm://bench/{ARRAY}_{i}",
        }
        for i in range(trials)
    ]
    options = {"jobs_dir": str(root / "dist-jobs-runs"), "cwd": str(root)}
    manifest = {"name": "sw", "backend": "slurm", "trials": rows, "options": options}
    (checkpoints / "sw" / "sweep.json").write_text(json.dumps(manifest))
    return checkpoints


def counted(log: Path, run: object) -> dict[str, int]:
    log.write_text("")
    if callable(run):
        run()
    names = [line.split()[0] for line in log.read_text().splitlines()]
    return {"squeue": names.count("squeue"), "sacct": names.count("sacct"), "total": len(names)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose dist_jobs runs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-polling-"))
    bin_dir, log = stand_ins(root, args.trials)
    checkpoints = sweep(root, args.trials)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(args.repo.resolve()))
    status = [sys.executable, "-m", "dist_jobs", "sweep", "status", "sw", "--checkpoint-dir", str(checkpoints)]
    plain = [["squeue", "--noheader", "--jobs", str(ARRAY)], ["sacct", "--noheader", "--jobs", str(ARRAY)]]

    def cli() -> None:
        subprocess.run(status, env=env, cwd=root, capture_output=True, check=True)

    def poll() -> None:  # one poll of Sweep.wait, in a process of the checkout under test
        code = "from dist_jobs.api.sweep_status import Sweep; import sys; Sweep.load(sys.argv[1]).status()"
        subprocess.run([sys.executable, "-c", code, str(checkpoints / "sw")], env=env, cwd=root, check=True)

    calls = {"sweep status": counted(log, cli), "one Sweep.wait poll": counted(log, poll)}
    ours, theirs = [], []
    for _ in range(args.repeats):  # interleaved: load on the machine hits both alike
        start = time.monotonic()
        cli()
        ours.append(time.monotonic() - start)
        start = time.monotonic()
        for argv in plain:
            subprocess.run(argv, env=env, capture_output=True, check=True)
        theirs.append(time.monotonic() - start)
    a, b = statistics.median(ours), statistics.median(theirs)
    result = {"trials": args.trials, "calls": calls, "sweep_status_s": round(a, 4), "squeue_sacct_s": round(b, 4)}
    if shutil.which("sacct"):  # a real cluster here: what squeue + sacct cost against slurmctld and slurmdbd
        real = []
        for _ in range(args.repeats):
            start = time.monotonic()
            for argv in plain:
                subprocess.run(argv, capture_output=True, check=False)
            real.append(time.monotonic() - start)
        result["real_squeue_sacct_s"] = round(statistics.median(real), 4)
    print(json.dumps({**result, "ratio": round(a / b, 2), "repo": str(args.repo)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
