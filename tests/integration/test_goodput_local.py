"""The goodput ledger of a real run on the local backend, against the test's own clock: rank 1 of
2 is SIGKILLed at step 7 (tests/support/fault_support.py), three steps after the checkpoint of
step 4; the launcher restarts every rank in place, which resumes from step 4 and recomputes steps
5 and 6. Status tells the ledger: its wall time is the test's, within 2 %."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import dist_jobs
from dist_jobs.api.plot import plot_run
from dist_jobs.rundir.verdict import Action, Ending, Failure, Verdict, record
from support.paths import PYTHON, REPO, TESTS
from support.specs import tiny_train
from support.tiers import requires
from support.waiting import eventually

pytestmark = [requires("torch"), pytest.mark.slow, pytest.mark.timeout(300)]

# 128 samples / (2 ranks x batch 4): 16 steps; a checkpoint every 4; each step slowed by 50 ms
TRAIN = tiny_train(model="support.fault_support:dying_net", fake_samples=128, checkpoint_every_steps=4)


def test_a_rank_killed_after_a_checkpoint_costs_the_steps_since_and_status_tells_it(tmp_path: Path) -> None:
    """Slow by nature: the ledger is checked against real time, so the run trains for real, is killed, restarts in
    place (torch started again in both ranks) and ends."""
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),
        "OMP_NUM_THREADS": "1",
        "DJ_TEST_STEP_DELAY": "0.05",
        "DJ_TEST_KILL_MARKER": str(tmp_path / "killed"),
        "DJ_TEST_KILL_BATCH": "7",
    }
    spec = dist_jobs.load_spec(data={"name": "gp", "nodes": 1, "procs_per_node": 2, "env": env, "train": TRAIN})
    began = time.time()
    job = dist_jobs.submit(spec, backend="local", workdir=tmp_path)
    exit_code = Path(job.id) / "local" / "exit_code"
    eventually(exit_code.exists, timeout=240, interval=0.02, what="the job's exit code")
    ended = time.time()
    info = job.status()
    assert info.word == "COMPLETED", "\n".join(job.logs())
    ledger = info.goodput
    assert ledger is not None
    assert ledger.wall_s == pytest.approx(ended - began, rel=0.02)
    parts = ledger.queued_s + ledger.startup_s + ledger.productive_s + ledger.lost_s + ledger.save_blocked_s
    assert parts == pytest.approx(ledger.wall_s, abs=0.01)
    killed, resumed = ledger.attempts
    assert (killed.attempt, killed.ending, killed.action, killed.rank) == ("0", "rank killed", "restart", 1)
    assert (killed.step_to, killed.kept_step, killed.lost_steps) == (6, 4, 2)  # steps 5 and 6 done twice
    assert (resumed.attempt, resumed.ending, resumed.resumed_from, resumed.step_to) == ("0.1", "completed", 4, 16)
    assert ledger.lost_steps == 2 and ledger.faults == 1
    # the lost time is the two recomputed steps (50 ms each, at least) and the wait for the fault
    assert 0.1 <= killed.lost_s < killed.end - killed.start
    assert ledger.productive_s >= 16 * 0.05 and 0 < ledger.save_blocked_s < ledger.productive_s
    # the CLI, from another process: the line and the JSON
    cli = {**os.environ, **env}
    table = subprocess.run([PYTHON, "-m", "dist_jobs", "status", job.handle], capture_output=True, text=True, env=cli)
    assert f"  {ledger.told()}" in table.stdout.splitlines(), table.stdout + table.stderr
    assert ledger.told().startswith("goodput ") and "(1 fault, " in ledger.told()
    out = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "status", "-o", "json", job.handle], capture_output=True, text=True, env=cli
    )
    seen = json.loads(out.stdout)
    assert seen["goodput"]["lost_steps"] == 2 and seen["goodput"]["faults"] == 1
    assert seen["goodput"]["wall_s"] == pytest.approx(ledger.wall_s, abs=0.001)
    assert [(a["attempt"], a["lost_steps"], a["ending"]) for a in seen["attempts"]] == [
        ("0", 2, "rank killed"),
        ("0.1", 0, "completed"),
    ]
    # the run as a picture: each attempt's steps, where the restart resumed, the fault
    drawn = plot_run(Path(job.id), tmp_path / "direct.png", job.handle)
    assert [steps[0] for steps in drawn.attempts] == [1, 5] and drawn.attempts[-1][-1] == 16, drawn
    assert drawn.resumed_at == [4] and drawn.faults == ["rank killed: rank 1 killed by SIGKILL (exit 137)"]
    png = tmp_path / "run.png"
    plotted = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "plot", job.handle, "-o", str(png)], capture_output=True, text=True, env=cli
    )
    assert plotted.returncode == 0 and plotted.stdout.strip() == str(png), plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_run_trained_further_plots_each_run_apart_with_its_own_ending(tmp_path: Path) -> None:
    """Three `dist-jobs run`s of one local run, each a submission of its own whose attempt is "0":
    the first completes at step 60; the second trains on from 60 and has a rank killed at step 80;
    the third resumes at 80 and logs nothing. The plot numbers the runs instead of repeating
    "attempt 0", draws the line where the second resumed, and marks the kill on the second run,
    not on the first (the verdicts and rows are paired by the goodput ledger's attempts)."""

    def lines(name: str, *records: dict) -> None:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))

    starts = [(100.0, 0), (200.0, 60), (300.0, 80)]
    lines("ledger.jsonl", *({"event": "start", "time": t, "attempt": 0, "resumed_step": s} for t, s in starts))
    rows = [(step, 100.0 + step) for step in range(10, 70, 10)] + [(70, 230.0), (80, 240.0)]
    lines("metrics.jsonl", *({"step": s, "time": t, "metrics": {"loss": 1.0 / s}} for s, t in rows))
    killed = Failure(1, "host", signal="SIGKILL")
    record(tmp_path, "a", Verdict(Ending.COMPLETED, Action.DONE, 0, attempt="0", time=170.0))
    record(tmp_path, "b", Verdict(Ending.RANK_KILLED, Action.RESTART, 200, killed.told(), 1, attempt="0", time=250.0))
    record(tmp_path, "c", Verdict(Ending.COMPLETED, Action.DONE, 0, attempt="0", time=310.0))
    drawn = plot_run(tmp_path, tmp_path / "run.png", "three runs")
    assert drawn.attempts == [[10, 20, 30, 40, 50, 60], [70, 80]], drawn  # the third logged nothing
    assert drawn.labels == ["#1", "#2"] and drawn.resumed_at == [60], drawn
    assert drawn.marked == ["rank killed (restart) at step 80"], drawn
    assert drawn.faults == ["rank killed: killed by SIGKILL on host"], drawn
