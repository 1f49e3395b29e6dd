"""Sweeps without a cluster: grid and random expansion, the errors, the golden array script and
PyTorchJobs, the array script's trial table run by bash, and the status table from progress files.

Refresh the goldens after changing a template or a sweep example:
    DIST_JOBS_REFRESH_EXAMPLES=1 python -m pytest tests/unit/api/test_sweep.py   (or: make examples)
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.api.sweep_submit import plan_sweep
from dist_jobs.cli.flags import _scalar
from dist_jobs.errors import SpecError
from dist_jobs.spec.sweep import Range, parse_grid, trial_name, trials
from support.lock_support import gone_launcher
from support.paths import PYTHON, REPO
from support.waiting import HUNG_S

SWEEPS = [
    (REPO / "slurm/examples/sweeps/resnet-lr-batch.yaml", "slurm", ".sbatch"),
    (REPO / "k8s/examples/sweeps/resnet-lr.yaml", "k8s", ".pytorchjobs.yaml"),
]
CPU = {
    "name": "cpu",
    "nodes": 2,
    "procs_per_node": 1,
    "checkpoint_dir": "ck",
    "image": "ghcr.io/example/train:1",
    "train": {"data": "fake"},
}


def dj(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=cwd, timeout=HUNG_S)


def problems(exc: pytest.ExceptionInfo[SpecError]) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in exc.value.problems]


# --- expansion -------------------------------------------------------------------------------


def test_grid_values_are_read_as_yaml_scalars_and_multiply_out_in_order() -> None:
    grid = parse_grid(["train.lr=0.1,0.01", "train.batch_size=64,128", "train.amp=bf16,none"], _scalar)
    assert grid["train.lr"] == [0.1, 0.01] and grid["train.batch_size"] == [64, 128]
    found = trials(grid)
    assert len(found) == 8
    assert found[0] == {"train.lr": 0.1, "train.batch_size": 64, "train.amp": "bf16"}
    assert found[1] == {"train.lr": 0.1, "train.batch_size": 64, "train.amp": "none"}
    assert found[-1] == {"train.lr": 0.01, "train.batch_size": 128, "train.amp": "none"}


def test_env_values_stay_text() -> None:
    assert parse_grid(["env.SEED=1,02,true"], _scalar) == {"env.SEED": ["1", "02", "true"]}


def test_random_is_reproducible_by_seed_and_stays_in_its_ranges() -> None:
    grid = parse_grid(["train.lr=loguniform:1e-4:1e-1", "train.batch_size=int:8:10", "train.amp=bf16,fp16"], _scalar)
    first = trials(grid, random=50, seed=3)
    assert first == trials(grid, random=50, seed=3) and first != trials(grid, random=50, seed=4)
    assert all(1e-4 <= t["train.lr"] <= 1e-1 for t in first)
    assert {t["train.batch_size"] for t in first} == {8, 9, 10}  # both ends included
    assert {t["train.amp"] for t in first} == {"bf16", "fp16"}
    lrs = sorted(t["train.lr"] for t in first)
    assert lrs[len(lrs) // 2] < 0.02  # log-uniform: the median is near 3e-3, not 0.05


def test_range_sample_rounds_to_six_digits() -> None:
    value = Range("uniform", 0.0, 1.0).sample(random.Random(0))
    assert value == float(f"{value:.6g}") and repr(Range("uniform", 0.5, 2.0)) == "uniform:0.5:2"


@pytest.mark.parametrize(
    "items,kwargs,field,words",
    [
        (["train.lr"], {}, "--grid", "KEY=V1,V2"),
        (["train.lr=1", "train.lr=2"], {}, "--grid train.lr", "given twice"),
        (["train.lr=loguniform:0:1"], {"random": 2}, "--grid train.lr", "not a valid range"),
        (["train.lr=uniform:a:b"], {"random": 2}, "--grid train.lr", "not a range"),
        (["train.lr=uniform:0:1"], {}, "--grid train.lr", "no grid points"),
        ([], {}, "--grid", "no parameters"),
        (["train.lr=1"], {"random": 0}, "--random", "at least 1"),
    ],
)
def test_bad_grids_name_the_flag_and_the_fix(items: list[str], kwargs: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as exc:
        trials(parse_grid(items, _scalar), **kwargs)
    assert any(f == field and words in m for f, m in problems(exc)), problems(exc)
    assert all(p.hint for p in exc.value.problems)


def test_trial_names_are_zero_padded_to_the_count() -> None:
    assert [trial_name("s", i, 12) for i in (0, 11)] == ["s-t00", "s-t11"]
    assert trial_name("s", 3, 4) == "s-t3"


# --- planning: every trial is a validated spec ---------------------------------------------------


def test_each_trial_has_its_own_run_and_the_sweep_root() -> None:
    plan = plan_sweep(None, {"train.lr": [0.1, 0.2]}, backend="local", overrides={**_flat(CPU)})
    assert [s.run_id for s in plan.specs] == ["cpu-t0", "cpu-t1"]
    assert {s.checkpoint_dir for s in plan.specs} == {"ck/cpu"}
    assert [s.train.lr for s in plan.specs] == [0.1, 0.2]


def test_unknown_key_and_bad_value_are_grid_problems_collected_once() -> None:
    with pytest.raises(SpecError) as exc:
        plan_sweep(None, {"train.lrr": [1, 2], "train.epochs": ["x", 2]}, backend="local", overrides=_flat(CPU))
    found = problems(exc)
    assert found.count(("--grid train.lrr", "unknown key")) == 1
    assert ("--grid train.epochs", "must be a whole number") in found
    assert "did you mean `lr`?" in str(exc.value)


def test_what_the_sweep_owns_and_what_one_array_cannot_vary_are_refused() -> None:
    with pytest.raises(SpecError) as exc:
        plan_sweep(None, {"name": ["a", "b"]}, backend="local", overrides=_flat(CPU))
    assert ("--grid name", "is set by the sweep for each trial") in problems(exc)
    with pytest.raises(SpecError) as exc:
        plan_sweep(None, {"nodes": [1, 2]}, backend="slurm", overrides=_flat(CPU))
    assert problems(exc) == [("--grid nodes", "differs between trials, but the trials of one SLURM job array share it")]
    assert "--backend k8s or local" in exc.value.problems[0].hint


def test_a_base_spec_that_would_share_one_run_directory_or_array_is_refused() -> None:
    overrides = {**_flat(CPU), "train.run_name": "fixed", "slurm.array": "0-3"}
    with pytest.raises(SpecError) as exc:
        plan_sweep(None, {"train.lr": [1, 2]}, backend="slurm", overrides=overrides)
    found = problems(exc)
    assert ("train.run_name", "would put every trial in one run directory") in found
    assert ("slurm.array", "a sweep on SLURM is its own job array") in found and len(found) == 2


def test_a_train_key_with_an_own_command_is_refused() -> None:
    overrides = {**_flat(CPU), "command": ["python3", "train.py"]}
    with pytest.raises(SpecError) as exc:
        plan_sweep(None, {"train.lr": [1, 2], "env.LR": ["1", "2"]}, backend="slurm", overrides=overrides)
    assert [f for f, _ in problems(exc)] == ["--grid train.lr"] and "env.KEY" in exc.value.problems[0].hint
    plan = plan_sweep(None, {"env.LR": ["1", "2"]}, backend="slurm", overrides=overrides)
    assert "export LR=2" in plan.text and "dj_program=(python3 train.py)" in plan.text


def test_k8s_refuses_max_parallel_and_labels_every_trial() -> None:
    with pytest.raises(SpecError) as exc:
        plan_sweep(None, {"train.lr": [1, 2]}, max_parallel=1, backend="k8s", overrides=_flat(CPU))
    assert problems(exc)[0][0] == "--max-parallel" and "queue" in exc.value.problems[0].hint
    plan = plan_sweep(None, {"train.lr": [1, 2]}, backend="k8s", overrides=_flat(CPU))
    every = list(yaml.safe_load_all(plan.text))
    docs = [d for d in every if d["kind"] == "PyTorchJob"]
    assert [d["metadata"]["name"] for d in docs] == ["cpu-t0", "cpu-t1"]
    roles = [d["rules"][0]["resourceNames"] for d in every if d["kind"] == "Role"]
    assert roles == [["cpu-t0"], ["cpu-t1"]], "each trial's pods may patch their own job alone"
    assert [d["metadata"]["labels"]["dist-jobs/trial"] for d in docs] == ["0", "1"]
    assert {d["metadata"]["labels"]["dist-jobs/sweep"] for d in docs} == {"cpu"}


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


# --- goldens -----------------------------------------------------------------------------------


def _golden_plan(sweep_file: Path, backend: str) -> Any:
    data = yaml.safe_load(sweep_file.read_text())
    return plan_sweep(
        sweep_file.parent / data["spec"],
        data["grid"],
        data.get("random"),
        data.get("seed", 0),
        data.get("max_parallel"),
        backend,
    )


@pytest.mark.parametrize("sweep_file,backend,suffix", SWEEPS, ids=[s[1] for s in SWEEPS])
def test_rendered_sweep_is_current(sweep_file: Path, backend: str, suffix: str) -> None:
    text = _golden_plan(sweep_file, backend).text
    golden = sweep_file.with_suffix(suffix)
    if os.environ.get("DIST_JOBS_REFRESH_EXAMPLES"):
        golden.write_text(text)
    assert golden.exists() and golden.read_text() == text, (
        f"{golden.relative_to(REPO)} differs; refresh: DIST_JOBS_REFRESH_EXAMPLES=1 pytest tests/unit/api/test_sweep.py"
    )


@pytest.mark.parametrize("sweep_file,backend,suffix", SWEEPS, ids=[s[1] for s in SWEEPS])
def test_cli_dry_run_prints_the_golden(sweep_file: Path, backend: str, suffix: str) -> None:
    data = yaml.safe_load(sweep_file.read_text())
    args = ["sweep", "--backend", backend, "--dry-run", str(sweep_file.parent / data["spec"])]
    for key, values in data["grid"].items():
        args += ["--grid", f"{key}={values if isinstance(values, str) else ','.join(map(str, values))}"]
    for flag in ("random", "seed", "max_parallel"):
        if flag in data:
            args += [f"--{flag.replace('_', '-')}", str(data[flag])]
    proc = dj(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == sweep_file.with_suffix(suffix).read_text()


def test_golden_array_script_is_one_array_with_percent_k() -> None:
    script = (REPO / "slurm/examples/sweeps/resnet-lr-batch.sbatch").read_text()
    assert script.count("#SBATCH --array=") == 1 and "#SBATCH --array=0-5%2" in script
    assert "#SBATCH --requeue" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert "#SBATCH --nodes=2" in script


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_array_script_passes_bash_n_and_shellcheck(tmp_path: Path, launcher: str) -> None:
    from support.tiers import require_tool

    overrides = {**_flat(CPU), "launcher": launcher}
    plan = plan_sweep(None, {"env.TAG": ["a b", "$x"], "train.lr": [0.1, 0.2]}, backend="slurm", overrides=overrides)
    path = tmp_path / "sweep.sbatch"
    path.write_text(plan.text)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    proc = subprocess.run([require_tool("shellcheck"), "-s", "bash", "-S", "warning", str(path)], capture_output=True)
    assert proc.returncode == 0, proc.stdout


def test_array_task_runs_its_trial_exactly_as_given(tmp_path: Path) -> None:
    """bash runs the trial table of the array script: each task gets its run name, env and argv,
    hostile values arriving as written; a task id outside the sweep stops with exit 2."""
    hostile = "a b'\"$(touch pwned)`x`;*"
    plan = plan_sweep(None, {"env.TAG": [hostile, "plain"], "train.lr": [0.5]}, backend="slurm", overrides=_flat(CPU))
    script = plan.text
    table = script[script.index('case "${SLURM_ARRAY_TASK_ID:-}"') : script.index("esac") + 4]
    probe = table + '\nprintf "%s\\n" "$DIST_JOBS_RUN" "$TAG" "${dj_program[@]}"\n'
    for task, tag in ((0, hostile), (1, "plain")):
        proc = subprocess.run(
            ["bash", "-c", probe],
            env={**os.environ, "SLURM_ARRAY_TASK_ID": str(task)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        lines = proc.stdout.splitlines()
        assert lines[:2] == [f"cpu-t{task}", tag] and "--lr=0.5" in lines[2:], proc.stdout
    assert not (tmp_path / "pwned").exists()
    proc = subprocess.run(["bash", "-c", probe], env={**os.environ, "SLURM_ARRAY_TASK_ID": "7"}, capture_output=True)
    assert proc.returncode == 2 and b"no trial of this sweep" in proc.stderr


# --- status --------------------------------------------------------------------------------------


def _fake_sweep(root: Path, runs: list[dict[str, Any]]) -> Path:
    """A local sweep's manifest and run directories, as if its trials had run."""
    from dist_jobs.rundir.history import append_history
    from dist_jobs.rundir.progress import write_progress

    trials_ = []
    for i, run in enumerate(runs):
        run_dir = root / "ck" / "sw" / f"sw-t{i}"
        (run_dir / "local").mkdir(parents=True)
        gone_launcher().write(run_dir / "local" / "pid")
        if run.get("exit") is not None:
            (run_dir / "local" / "exit_code").write_text(f"{run['exit']}\n")
        for step, metrics in enumerate(run.get("history", []), 1):
            append_history(run_dir, {"step": step, "epoch": 0, "time": 1.0, "metrics": metrics})
        if "progress" in run:
            write_progress(run_dir, run["progress"])
        handle = f"local://{run_dir}"
        trials_.append(
            {"index": i, "name": f"sw-t{i}", "params": run["params"], "run_dir": str(run_dir), "handle": handle}
        )
    manifest = {"name": "sw", "backend": "local", "trials": trials_, "options": {}}
    (root / "ck" / "sw" / "sweep.json").write_text(json.dumps(manifest))
    return root / "ck"


def _progress(step: int, total: int, state: str, **metrics: float) -> dict[str, Any]:
    return {
        "step": step,
        "total_steps": total,
        "epoch": 0,
        "metrics": metrics,
        "attempt": 0,
        "time": 1.0,
        "state": state,
    }


RUNS = [
    {
        "params": {"train.lr": 0.1},
        "exit": 0,
        "history": [{"loss": 2.0, "eval_loss": 1.5}, {"loss": 1.0, "eval_loss": 0.9}],
        "progress": _progress(10, 10, "finished", loss=1.0, eval_loss=0.9),
    },
    {
        "params": {"train.lr": 0.01},
        "history": [{"loss": 3.0, "eval_loss": 0.5}, {"loss": 2.5, "eval_loss": 0.7}],
        "progress": _progress(4, 10, "running", loss=2.5, eval_loss=0.7),
    },
    {"params": {"train.lr": 0.001}, "exit": 1},
]


def test_status_rows_best_by_default_metric_min_and_by_max(tmp_path: Path) -> None:
    from dist_jobs.api.sweep_status import Sweep

    root = _fake_sweep(tmp_path, RUNS)
    rows = Sweep.load("sw", str(root)).status()
    assert [r.state for r in rows] == ["succeeded", "failed", "failed"]  # trial 1's pid 1 is no dist-jobs run
    assert [(r.step, r.total_steps, r.metric) for r in rows[:2]] == [(10, 10, "eval_loss"), (4, 10, "eval_loss")]
    assert (rows[1].latest, rows[1].best) == (0.7, 0.5)  # best over the history, not the latest
    assert [r.is_best for r in rows] == [False, True, False] and rows[2].best is None
    rows = Sweep.load("sw", str(root)).status(metric="loss", mode="max")
    assert [r.is_best for r in rows] == [False, True, False] and rows[1].best == 3.0
    rows = Sweep.load(str(root / "sw")).status(metric="loss", mode="min")
    assert [r.is_best for r in rows] == [True, False, False]


def test_cli_status_table_marks_the_best_and_json_has_every_row(tmp_path: Path) -> None:
    root = _fake_sweep(tmp_path, RUNS)
    proc = dj("sweep", "status", "sw", "--checkpoint-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    header, *lines = proc.stdout.splitlines()
    assert header.split() == ["TRIAL", "train.lr", "STATE", "STEP", "METRIC", "LATEST", "BEST"]
    assert re.match(r"\*\s+sw-t1\s+0.01\s+failed\s+4/10\s+eval_loss\s+0.7\s+0.5$", lines[1]), lines
    assert lines[0].startswith(" ") and lines[2].split()[:2] == ["sw-t2", "0.001"]
    rows = json.loads(dj("sweep", "status", "sw", "--checkpoint-dir", str(root), "-o", "json").stdout)
    assert [r["index"] for r in rows] == [0, 1, 2] and [r["is_best"] for r in rows] == [False, True, False]


def test_cli_bad_input_exits_2_without_traceback(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(CPU))
    cases = [
        (["sweep", "--backend", "slurm", str(spec), "--grid", "train.lr=abc"], "--grid train.lr: must be a number"),
        (["sweep", "--backend", "slurm", str(spec), "--grid", "train.lrr=1"], "did you mean `lr`?"),
        (["sweep", "--backend", "slurm", str(spec)], "no parameters to sweep"),
        (["sweep", str(spec), "--grid", "train.lr=1"], "pass --backend"),
        (["sweep", "status", "nope", "--checkpoint-dir", str(tmp_path)], "no sweep 'nope'"),
    ]
    for args, words in cases:
        proc = dj(*args, "--dry-run") if args[1] != "status" else dj(*args)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_sweep_status_help() -> None:
    proc = dj("sweep", "status", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: dist-jobs sweep status")
    assert "--metric" in proc.stdout and "--mode" in proc.stdout
    assert "sweep status NAME" in dj("sweep", "--help").stdout and "sweep cancel NAME" in dj("sweep", "--help").stdout
    cancel = dj("sweep", "cancel", "--help")
    assert cancel.returncode == 0 and cancel.stdout.startswith("usage: dist-jobs sweep cancel")
    sweep = next(line for line in dj("completion", "bash").stdout.splitlines() if line.strip().startswith("sweep)"))
    assert "--grid" in sweep and "--max-parallel" in sweep and "--drive" not in sweep


def test_array_task_record_names_the_trials_run_and_logs(tmp_path: Path) -> None:
    from dist_jobs.backends.slurm.meta import job_meta, record_trials

    folder = tmp_path / "sw-41"
    folder.mkdir()
    record = {"job_id": "41", "run": "sw", "log_dir": "/logs", "run_dir": "/ck/sw/sw"}
    (folder / "job.json").write_text(json.dumps(record))
    record_trials(tmp_path, "41", ["sw-t0", "sw-t1"])
    meta = job_meta(tmp_path, "41_1")
    assert (meta["run"], meta["run_dir"], meta["batch_log"]) == ("sw-t1", "/ck/sw/sw-t1", "sw-41_1.out")
    assert job_meta(tmp_path, "41")["batch_log"] == "sw-41.out"
    assert job_meta(tmp_path, "41_2") == {} and job_meta(tmp_path, "42_0") == {}


# Real `sacct --parsable2 --noheader --duplicates --jobs 492 --format SACCT_FIELDS` of a cancelled
# sweep (slurm/cluster): task 0 ran; tasks 1 and 2 never started and share the array's record.
SACCT_CANCELLED_SWEEP = """\
492_0|493|CANCELLED by 0|0:0|2026-11-24T14:48:12|2026-11-24T14:48:13|2026-11-24T14:48:21|00:00:08|2|n[1-2]|debug|long
492_0.batch|493.batch|FAILED|15:0|2026-11-24T14:48:13|2026-11-24T14:48:13|2026-11-24T14:48:21|00:00:08|1|n1||batch
492_0.0|493.0|CANCELLED|0:15|2026-11-24T14:48:15|2026-11-24T14:48:15|2026-11-24T14:48:21|00:00:06|2|n[1-2]||python
492_[1-2%1]|492|CANCELLED by 0|0:0|2026-11-24T14:48:12|None|2026-11-24T14:48:21|00:00:00|2|None assigned|debug|long
"""


def test_an_array_task_that_never_started_is_found_in_the_arrays_record() -> None:
    from dist_jobs.backends.slurm.backend import SlurmBackend
    from dist_jobs.backends.slurm.meta import array_task_key
    from dist_jobs.backends.slurm.squeue_sacct import parse_sacct

    rows = parse_sacct(SACCT_CANCELLED_SWEEP)
    assert [array_task_key(rows, f"492_{i}") for i in range(4)] == ["492_0", "492_[1-2%1]", "492_[1-2%1]", "492_3"]

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        out = SACCT_CANCELLED_SWEEP if argv[0] == "sacct" and argv[argv.index("--jobs") + 1] == "492" else ""
        return subprocess.CompletedProcess(argv, 0 if argv[0] == "sacct" else 1, out, "")

    backend = SlurmBackend(runner=runner, cluster="c")
    assert [backend.status(f"492_{i}").state for i in range(3)] == ["CANCELLED"] * 3


def test_a_slurm_sweeps_status_asks_squeue_and_sacct_once_whatever_the_trial_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dist_jobs.backends.slurm.backend as slurm
    from dist_jobs.api.sweep_status import Sweep

    queue = (
        "".join(
            f"600_{i}|RUNNING|None|1|n1|0:05|UNLIMITED|2026-11-22T05:22:33|2026-11-22T05:22:34|debug|0|sw\n"
            for i in range(1, 3)
        )
        + "600_[3-99%2]|PENDING|JobArrayTaskLimit|1||0:00|UNLIMITED|2026-11-22T05:22:33|N/A|debug|0|sw\n"
    )
    stamp = "2026-11-22T05:22:22"
    acct = f"600_0|601|COMPLETED|0:0|{stamp}|{stamp}|{stamp}|00:00:09|1|n1|debug|sw\n"
    calls: list[str] = []

    def runner(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        calls.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, queue if argv[0] == "squeue" else acct, "")

    monkeypatch.setattr(slurm, "run_command", runner)
    trials_ = [
        {
            "index": i,
            "name": f"sw-t{i}",
            "params": {"train.lr": i},
            "run_dir": str(tmp_path / f"sw-t{i}"),
            "handle": f"slurm://c/600_{i}",
        }
        for i in range(100)
    ]
    manifest = {"name": "sw", "backend": "slurm", "trials": trials_, "options": {"jobs_dir": str(tmp_path)}}
    rows = Sweep(manifest, tmp_path / "sweep.json").status()
    assert calls == ["squeue", "sacct"]
    assert [r.state for r in rows[:4]] == ["succeeded", "running", "running", "pending"]
    assert {r.state for r in rows[3:]} == {"pending"}
