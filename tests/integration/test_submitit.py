"""submitit from a job spec: the parameter mapping, the sbatch file submitit would submit, and a
real run of TrainTask under submitit's local executor (2 processes, gloo on CPU).

The same TrainTask on the real SLURM cluster is in tests/integration/test_slurm_cluster.py.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.backends.submitit_executor import executor_parameters, make_executor
from dist_jobs.errors import UsageError
from dist_jobs.ranks.ports import derive_port
from dist_jobs.spec import run_id
from dist_jobs.spec.load import load_spec
from dist_jobs.train.task import SUBMITIT_SIGNAL, FunctionTask, TrainTask
from support.paths import REPO, TESTS
from support.specs import tiny_train
from support.tiers import require_module, requires

submitit = require_module("submitit")
pytestmark = pytest.mark.timeout(180)

SPEC: dict[str, Any] = {
    "name": "notebook run",
    "nodes": 2,
    "procs_per_node": 4,
    "cpus_per_task": 3,
    "gpus_per_node": 4,
    "memory": "64G",
    "time": "1:30:00",
    "env": {"OMP_NUM_THREADS": "3", "NOTE": "it's a test"},
    "setup": ["module load cuda/12.4"],
    "preemption": {"grace_seconds": 150, "max_requeues": 5},
    "slurm": {"partition": "gpu", "account": "ml", "exclusive": True, "constraint": "a100"},
}


def test_parameters_for_slurm() -> None:
    params = executor_parameters(load_spec(data=SPEC), "slurm")
    assert params == {
        "name": run_id("notebook run"),  # notebook-run-<hash>: the name has a space
        "nodes": 2,
        "tasks_per_node": 4,
        "cpus_per_task": 3,
        "gpus_per_node": 4,
        "timeout_min": 90,
        "mem_gb": 64,
        "slurm_partition": "gpu",
        # the spec's env first (Python reads PYTHONPATH & co. at start-up), then its setup lines
        "slurm_setup": ["export OMP_NUM_THREADS=3", "export NOTE='it'\"'\"'s a test'", "module load cuda/12.4"],
        "slurm_signal_delay_s": 150,
        "slurm_additional_parameters": {"account": "ml", "constraint": "a100", "requeue": True},
        "slurm_exclusive": True,
    }


def test_parameters_for_the_local_executor_have_no_slurm_keys() -> None:
    params = executor_parameters(load_spec(data={**SPEC, "time": None}), "local")
    assert not [key for key in params if key.startswith("slurm_")]
    assert params["timeout_min"] == 60  # no time limit in the spec


@pytest.mark.parametrize(
    "memory,gigabytes", [("64G", 64), ("1T", 1024), ("2048M", 2), ("512M", 1), ("4096", 4), ("100K", 1)]
)
def test_memory_in_whole_gigabytes_at_least_one(memory: str, gigabytes: int) -> None:
    assert executor_parameters(load_spec(data={**SPEC, "memory": memory}), "local")["mem_gb"] == gigabytes


def test_slurm_executor_writes_what_the_spec_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sbatch file submitit would submit (built, not submitted: no cluster needed)."""
    # submitit's SlurmExecutor refuses to exist without an `srun` on PATH; nothing runs it here.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 99\n")
    (fake_bin / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    executor = make_executor(load_spec(data=SPEC), tmp_path / "%j", cluster="slurm")
    inner = executor._executor
    assert inner.max_num_timeout == 5  # an argument of the executor, not a job parameter
    text = inner._make_submission_file_text("python -u -m submitit.core._submit X", "uid")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --cpus-per-task=3",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml",
        "#SBATCH --constraint=a100",
        "#SBATCH --exclusive",
        "#SBATCH --requeue",
        f"#SBATCH --job-name={run_id('notebook run')}",
        "#SBATCH --time=90",
        "#SBATCH --mem=64GB",
        f"#SBATCH --signal={SUBMITIT_SIGNAL[3:]}@150",
    ):
        assert line in text.splitlines(), f"{line!r} missing from:\n{text}"
    lines = text.splitlines()
    assert (
        lines.index("export OMP_NUM_THREADS=3")
        < lines.index("module load cuda/12.4")
        < next(i for i, line in enumerate(lines) if line.startswith("srun "))
    )


def test_local_executor_runs_one_node_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here: the local executor is chosen
    with pytest.raises(UsageError, match="local executor runs one node, the spec asks for 2") as caught:
        make_executor(load_spec(data=SPEC), tmp_path)
    assert "dist-jobs run --backend local" in (caught.value.hint or "")


def test_train_task_pickles_and_requeues_itself() -> None:
    spec = load_spec(data=SPEC)
    task = pickle.loads(pickle.dumps(TrainTask(spec)))
    assert task.spec == spec
    again = task.checkpoint()
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert isinstance(again.function, TrainTask) and again.function.spec == spec


@requires("torch")
def test_train_task_under_the_local_executor_returns_every_ranks_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS)]))  # tiny_net for the children
    spec = load_spec(
        data={
            "name": "local",
            "nodes": 1,
            "procs_per_node": 2,
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "env": {"OMP_NUM_THREADS": "1"},
            "time": "5",
            "train": tiny_train(log_every=None, deterministic=True),
        }
    )
    job = make_executor(spec, tmp_path / "jobs" / "%j", cluster="local").submit(TrainTask(spec))
    try:
        results = job.results()  # two tasks: submitit refuses job.result() for them
    finally:
        job.cancel(check=False)
    assert len(results) == 2 and results[0] == results[1]
    assert results[0]["step"] == 4.0 and results[0]["epoch"] == 0.0  # 32 samples / 2 ranks / batch 4
    assert {"train_loss", "eval_loss", "eval_accuracy"} <= results[0].keys()
    assert (tmp_path / "checkpoints" / "local" / "step-4" / "COMPLETE").exists()


@requires("torch")
@pytest.mark.parametrize("port", [None, 29633])
def test_your_own_function_gets_the_ranks_under_the_local_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port: int | None
) -> None:
    from support.envscript import report

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS)]))  # `support` for the children
    monkeypatch.setenv("MASTER_PORT", "1")  # the submitter's own: never the job's
    spec = load_spec(
        data={
            "name": "fn",
            "nodes": 1,
            "procs_per_node": 2,
            "time": "5",
            "env": {"DIST_JOBS_RDZV_TIMEOUT": "60"},
            **({"master_port": port} if port else {}),
        }
    )
    job = make_executor(spec, tmp_path / "jobs" / "%j", cluster="local").submit(FunctionTask(spec, report))
    try:
        results = sorted(job.results(), key=lambda r: r["rank"])
    finally:
        job.cancel(check=False)
    assert [(r["rank"], r["local_rank"], r["world"], r["sum"]) for r in results] == [(0, 0, 2, 1.0), (1, 1, 2, 1.0)]
    assert {(r["local_world_size"], r["group_rank"], r["node_rank"]) for r in results} == {("2", "0", "0")}
    # The spec's port, else dist-jobs' derived one (outside the ephemeral range), not submitit's pick.
    assert {r["master_port"] for r in results} == {str(port or derive_port(int(job.job_id)))}


def test_function_task_adds_submitits_signal_for_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    from dist_jobs.train.signals import LAUNCH_SIGNALS_VAR, preempt_signals

    task = pickle.loads(pickle.dumps(FunctionTask(load_spec(data=SPEC), print, "hello", end="")))
    assert (task.fn, task.args, task.kwargs) == (print, ("hello",), {"end": ""})
    assert isinstance(task.checkpoint().function, FunctionTask)
    monkeypatch.setenv(LAUNCH_SIGNALS_VAR, SUBMITIT_SIGNAL)
    assert preempt_signals(("SIGUSR1", "SIGTERM")) == ("SIGUSR1", "SIGTERM", "SIGUSR2")
