"""A sweep on the real test cluster: 4 trials of 2 nodes each as ONE job array, one trial at a
time (`--max-parallel 1`: each trial takes both nodes), every trial its own run; `sweep status`
shows 4 finished rows with the best marked. And a trial stopped by the scheduler is requeued on
its own and resumes from its checkpoint, while the other trials are untouched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import slurm_jobs
from support.specs import tiny_train
from support.tiers import requires
from support.waiting import eventually

pytestmark = [requires("slurm"), pytest.mark.slow, pytest.mark.timeout(420)]


def spec_data(root: Path, name: str, **train: Any) -> dict[str, Any]:
    """A 2 x 1 job of the tiny_net run (support.specs.tiny_train), a checkpoint every step."""
    train = tiny_train(checkpoint_every_steps=1, **train)
    return slurm_jobs.spec_data(root, name, train, procs_per_node=1, unbuffered=False)


def dj(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=root, timeout=timeout
    )


def submit(root: Path, data: dict[str, Any], *grid: str) -> list[dict[str, Any]]:
    (root / "job.yaml").write_text(yaml.safe_dump(data))
    args = ["sweep", "--backend", "slurm", "job.yaml", "--jobs-dir", "runs", "--max-parallel", "1", "-o", "json"]
    proc = dj(root, *args, *[a for g in grid for a in ("--grid", g)])
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout)["trials"])


def wait_all(root: Path, handles: list[str], timeout: float) -> None:
    for handle in handles:
        proc = dj(root, "wait", "--jobs-dir", "runs", "--timeout", str(timeout), handle, timeout=timeout + 30)
        logs = sorted((root / "logs").glob("*"))
        assert proc.returncode == 0, proc.stdout + proc.stderr + "\n".join(p.read_text()[-2000:] for p in logs)


def cancel(handles: list[str]) -> None:
    if handles:
        subprocess.run(["scancel", handles[0].rsplit("/", 1)[1].split("_")[0]], capture_output=True)


def test_four_trials_of_two_nodes_one_array_and_status_marks_the_best(tmp_path: Path) -> None:
    """Slow by nature: four 2-node trials of one job array, which the cluster runs one after another."""
    trials = submit(tmp_path, spec_data(tmp_path, "lr"), "train.lr=0.2,0.05", "train.batch_size=4,8")
    handles = [t["handle"] for t in trials]
    try:
        arrays = {re.fullmatch(r"slurm://[^/]+/(\d+)_(\d)", h).group(1) for h in handles}  # type: ignore[union-attr]
        assert len(arrays) == 1 and [h[-1] for h in handles] == ["0", "1", "2", "3"], handles  # ONE job array
        wait_all(tmp_path, handles, 300)
        rows = json.loads(dj(tmp_path, "sweep", "status", "lr", "--checkpoint-dir", "checkpoints", "-o", "json").stdout)
        assert [r["state"] for r in rows] == ["succeeded"] * 4
        assert [r["name"] for r in rows] == ["lr-t0", "lr-t1", "lr-t2", "lr-t3"]
        assert [r["params"] for r in rows] == [t["params"] for t in trials]
        assert [(r["step"], r["total_steps"]) for r in rows] == [(4, 4), (2, 2), (4, 4), (2, 2)]  # 32 / (2 x batch)
        best = [r for r in rows if r["is_best"]]
        assert len(best) == 1 and best[0]["best"] == min(r["best"] for r in rows) and best[0]["metric"] == "eval_loss"
        for row in rows:  # each trial is its own run: own folder, checkpoints, result, 2-node log
            run_dir = tmp_path / "checkpoints" / "lr" / row["name"]
            assert (run_dir / "result.json").is_file() and sorted(run_dir.glob("step-*")), row
            assert len(list((tmp_path / "logs").glob(f"{row['name']}-*_{row['index']}-attempt0-rank*.out"))) == 2
        table = dj(tmp_path, "sweep", "status", "lr", "--checkpoint-dir", "checkpoints")
        marked = [line for line in table.stdout.splitlines() if line.startswith("*")]
        assert len(marked) == 1 and best[0]["name"] in marked[0], table.stdout
        (tmp_path / "status.txt").write_text(table.stdout)
        logs = dj(tmp_path, "logs", "--jobs-dir", "runs", "--rank", "1", handles[2])
        assert "dist-jobs: rank 1/2" in logs.stdout, logs.stderr  # the trial's own logs, by its handle
        if os.environ.get("DIST_JOBS_SWEEP_STATUS_OUT"):  # the note shows this table
            Path(os.environ["DIST_JOBS_SWEEP_STATUS_OUT"]).write_text(table.stdout)
    finally:
        cancel(handles)


def test_a_stopped_trial_is_requeued_alone_and_resumes(tmp_path: Path) -> None:
    """Slow by nature: trial 0's first attempt is slowed to 1 s a step so the signal lands mid-training, and its
    requeued attempt waits out the cluster's 10 s credential hold before it may start again and train the rest
    of its 12 steps."""
    data = spec_data(tmp_path, "rq", epochs=3)
    data["setup"].append('if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then export DJ_TEST_STEP_DELAY=1.0; fi')
    trials = submit(tmp_path, data, "train.lr=0.1,0.05")
    handles = [t["handle"] for t in trials]
    try:
        task = handles[0].rsplit("/", 1)[1]
        log0 = tmp_path / "logs" / f"rq-t0-{task}-attempt0-rank0.out"
        eventually(
            lambda: log0.exists() and "step 3/12" in log0.read_text(errors="replace"),
            timeout=120,
            interval=0.5,
            what="trial 0 to reach step 3",
        )
        assert subprocess.run(["scancel", "--signal=TERM", task], capture_output=True).returncode == 0
        wait_all(tmp_path, handles, 330)
        batch = (tmp_path / "logs" / f"rq-{task}.out").read_text()
        assert "dist-jobs: requeueing job" in batch and "step finished with exit code 200" in batch, batch
        resumed = (tmp_path / "logs" / f"rq-t0-{task}-attempt1-rank0.out").read_text(errors="replace")
        assert re.search(r"resumed from \S+/rq/rq-t0/step-\d+", resumed), resumed[-2000:]
        other = handles[1].rsplit("/", 1)[1]
        assert not list((tmp_path / "logs").glob(f"rq-t1-{other}-attempt1-*")), "trial 1 was not stopped"
        rows = json.loads(dj(tmp_path, "sweep", "status", "rq", "--checkpoint-dir", "checkpoints", "-o", "json").stdout)
        assert [(r["state"], r["step"]) for r in rows] == [("succeeded", 12), ("succeeded", 12)]
    finally:
        cancel(handles)


def test_sweep_cancel_cancels_the_running_and_the_waiting_trials(tmp_path: Path) -> None:
    data = spec_data(tmp_path, "long")
    data["command"] = ["python3", "-c", "import time; time.sleep(200)"]
    trials = submit(tmp_path, data, "env.X=1,2,3")
    handles = [t["handle"] for t in trials]
    try:
        first = handles[0].rsplit("/", 1)[1]
        eventually(
            lambda: subprocess.run(["squeue", "-h", "-j", first, "-o", "%T"], capture_output=True, text=True).stdout,
            until=lambda said: "RUNNING" in said,
            timeout=60,
            interval=0.5,
            what="trial 0 to start",
        )
        proc = dj(tmp_path, "sweep", "cancel", "long", "--checkpoint-dir", "checkpoints")
        assert proc.returncode == 0 and proc.stdout.split() == [w for h in handles for w in ("cancelled", h)]

        def states() -> list[str]:
            status = dj(tmp_path, "sweep", "status", "long", "--checkpoint-dir", "checkpoints", "-o", "json")
            return [r["state"] for r in json.loads(status.stdout)]

        eventually(
            states,
            until=lambda seen: seen == ["cancelled"] * 3,
            timeout=60,
            interval=1.0,
            what="every trial to be cancelled",
        )
    finally:
        cancel(handles)
