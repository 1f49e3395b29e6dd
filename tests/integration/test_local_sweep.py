"""A local sweep from Python: `dist_jobs.sweep(...)` returns one handle per trial, at most K trials
run at once (a detached driver starts the rest), every trial sees its own values and run name."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import dist_jobs
from dist_jobs.spec.model import JobSpec
from support.waiting import HUNG_S, eventually

pytestmark = [pytest.mark.timeout(180)]

RECORD = textwrap.dedent("""
    import json, os, pathlib, time
    start = time.time()
    time.sleep(1.5)
    out = pathlib.Path(os.environ["OUT"]) / (os.environ["DIST_JOBS_RUN"] + ".json")
    out.write_text(json.dumps({"tag": os.environ["TAG"], "start": start, "end": time.time()}))
""")


def one_process_job(tmp_path: Path, name: str, code: str, **fields: Any) -> JobSpec:
    """A job of one process running `python3 -c CODE`, its run directories in tmp_path/ck."""
    data = {"name": name, "nodes": 1, "procs_per_node": 1, "checkpoint_dir": str(tmp_path / "ck"), **fields}
    return dist_jobs.load_spec(data={**data, "command": ["python3", "-c", code]})


def _pid(path: Path) -> int:
    return int(path.read_text().split()[0])  # "PID START"


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def driving(pid: int) -> bool:
    """Whether `pid` is still a sweep driver (an exited one is gone, or a zombie with no cmdline)."""
    try:
        return b"--drive" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_local_sweep_runs_k_at_a_time_and_returns_handles(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    spec = one_process_job(tmp_path, "loc", RECORD, env={"OUT": str(out)})
    sweep = dist_jobs.sweep(spec, grid={"env.TAG": ["a", "b c", "$d"]}, max_parallel=2, backend="local")
    assert sweep.handles == [f"local://{tmp_path / 'ck' / 'loc' / f'loc-t{i}'}" for i in range(3)]
    assert [str(job) for job in sweep.jobs] == sweep.handles
    eventually(
        lambda: len(list(out.glob("*.json"))) >= 3 and all(r.state == "succeeded" for r in sweep.status()),
        timeout=120,
        interval=0.5,
        what="every trial to write its record and succeed",
        context=lambda: [r.to_dict() for r in sweep.status()],
    )
    runs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert {k: v["tag"] for k, v in runs.items()} == {"loc-t0": "a", "loc-t1": "b c", "loc-t2": "$d"}
    events = sorted([(r["start"], 1) for r in runs.values()] + [(r["end"], -1) for r in runs.values()])
    running = [sum(step for _, step in events[: i + 1]) for i in range(len(events))]
    assert max(running) <= 2  # never more than K at once
    assert runs["loc-t2"]["start"] >= min(runs["loc-t0"]["end"], runs["loc-t1"]["end"])
    again = dist_jobs.Sweep.load("loc", str(tmp_path / "ck"))
    assert [r.params for r in again.status()] == [{"env.TAG": "a"}, {"env.TAG": "b c"}, {"env.TAG": "$d"}]


def test_sweep_cancel_stops_the_driver_and_the_running_trial(tmp_path: Path) -> None:
    import subprocess
    import sys

    spec = one_process_job(tmp_path, "long", "import time; time.sleep(60)")
    sweep = dist_jobs.sweep(spec, grid={"env.X": ["1", "2", "3"]}, max_parallel=1, backend="local")
    run_dirs = [Path(h.removeprefix("local://")) for h in sweep.handles]
    # The detached `dist-jobs run` installs its signal handlers before it starts any process: once
    # it has a child, a SIGTERM is a cancel.
    pid_file = run_dirs[0] / "local" / "pid"
    eventually(
        lambda: pid_file.exists() and children(_pid(pid_file)),
        timeout=60,
        interval=0.05,
        what="trial 0's `dist-jobs run` to have a child",
    )
    argv = [sys.executable, "-m", "dist_jobs", "sweep", "cancel", "long", "--checkpoint-dir", str(tmp_path / "ck")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=HUNG_S)
    assert proc.returncode == 0 and proc.stdout.strip() == f"cancelled {sweep.handles[0]}", proc.stdout + proc.stderr
    eventually(
        lambda: sweep.status()[0],
        until=lambda trial: trial.state == "cancelled",
        timeout=60,
        interval=0.05,
        what="trial 0 to be cancelled",
    )
    # Once the driver has exited, nothing can start trial 1 any more.
    driver = tmp_path / "ck" / "long" / "driver.pid"
    eventually(lambda: not driving(_pid(driver)), timeout=60, interval=0.05, what="the sweep driver to exit")
    assert [r.state for r in sweep.status()] == ["cancelled", "pending", "pending"]
    assert not (run_dirs[1] / "local").exists()


def test_cli_sweep_wait_prints_the_table_and_exits_by_the_trials(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "import os, sys; sys.exit(int(os.environ['CODE']))"
    argv = [sys.executable, "-m", "dist_jobs", "sweep", "--backend", "local", "--name", "w", "--procs-per-node", "1"]
    argv += ["--grid", "env.CODE=0,3", "--max-parallel", "1", "--wait", "--", "python3", "-c", code]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=HUNG_S, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one trial failed
    rows = [line.split() for line in proc.stderr.splitlines()[1:]]
    assert [r[:3] for r in rows] == [["w-t0", "0", "succeeded"], ["w-t1", "3", "failed"]], proc.stderr
