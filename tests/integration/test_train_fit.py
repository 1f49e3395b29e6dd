"""fit() as a user calls it: AMP, gradient accumulation, metrics on every rank, checkpoint contents,
resuming in another world size. One process runs in this test process; two-rank runs launch
a user script of the kind the README shows (its own model and data, calling fit())."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from dist_jobs import __version__
from dist_jobs.errors import UsageError
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.loop import fit
from support.train_support import PYTHON, final_state, start_ranks, wait_all
from support.workloads import plain_net, tiny_data, tiny_net

# Its tests share one module-scoped reference run: one xdist worker runs them all.
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("test_train_fit")]

USER_SCRIPT = """
import logging, os, sys, torch
from dist_jobs.errors import DistJobsError
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.loop import fit
from support.workloads import plain_net, tiny_data

logging.basicConfig(level=logging.INFO)
config = TrainConfig.from_argv(sys.argv[2:])
torch.manual_seed(0)
model = plain_net(config.num_classes)
try:
    metrics = fit(config, model, tiny_data(True, config), tiny_data(False, config))
except DistJobsError as error:
    sys.exit(error.exit_code)
torch.save({"metrics": metrics, "params": model.state_dict()},
           os.path.join(sys.argv[1], "rank%s.pt" % os.environ["RANK"]))
"""
SMALL = ["--image-size", "8", "--fake-samples", "64", "--epochs", "2", "--lr", "0.05", "--no-progress", "--seed", "11"]


def _two_ranks(tmp_path: Path, name: str, *args: str, logs: list[str] | None = None) -> list[dict]:
    script = tmp_path / "user_train.py"
    script.write_text(USER_SCRIPT)
    out = tmp_path / name
    out.mkdir()
    launches = start_ranks([*SMALL, *args], out, command=[PYTHON, str(script), str(out)])
    codes = wait_all(launches, timeout=150)
    assert codes == [0, 0], launches[0].text()[-3000:] + launches[1].text()[-2000:]
    if logs is not None:
        logs.append(launches[0].text())
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


def test_gradients_through_shared_memory_train_the_model_gloo_trains(tmp_path: Path) -> None:
    """Both ranks on this host: fit() all-reduces through /dev/shm, and two ranks get gloo's bits."""
    logs: list[str] = []
    shared = _two_ranks(tmp_path, "shared", "--shm-allreduce", logs=logs)
    gloo = _two_ranks(tmp_path, "gloo", logs=logs)  # the default: gloo's own all-reduce
    assert "gradients: all-reduced through shared memory (2 ranks on this host" in logs[0]
    assert "through shared memory" not in logs[1]
    for a, b in zip(shared, gloo):
        speed = "train_samples_per_s"
        assert {k: v for k, v in a["metrics"].items() if k != speed} == {
            k: v for k, v in b["metrics"].items() if k != speed
        }
        assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[dict], list[dict], Path]]:
    """The same 2-rank job as batch 8 x accumulation 2 and as batch 16 (async checkpoints): two
    whole runs, once per module, for the tests that compare them."""
    tmp = tmp_path_factory.mktemp("accum")
    ckpt = tmp / "ckpt"
    accum = _two_ranks(
        tmp,
        "accum",
        "--batch-size",
        "8",
        "--grad-accum",
        "2",
        "--checkpoint-dir",
        str(ckpt),
        "--run-name",
        "timed",
        "--checkpoint-every-minutes",
        "0.0001",
    )
    whole = _two_ranks(
        tmp,
        "whole",
        "--batch-size",
        "16",
        "--checkpoint-dir",
        str(ckpt),
        "--run-name",
        "async",
        "--async-checkpoint",
        "--checkpoint-every-steps",
        "1",
    )
    yield accum, whole, ckpt


def test_grad_accumulation_matches_the_larger_batch(accumulated) -> None:
    accum, whole, _ = accumulated
    for name, tensor in whole[0]["params"].items():
        # DDP kept the ranks identical, bit for bit, with no_sync on the first micro-batch.
        assert torch.equal(accum[0]["params"][name], accum[1]["params"][name]), name
        torch.testing.assert_close(accum[0]["params"][name], tensor, rtol=1e-5, atol=1e-6)
    assert accum[0]["metrics"]["step"] == whole[0]["metrics"]["step"] == 4  # 64/2/16 x 2 epochs


def test_metrics_are_reduced_identically_on_every_rank(accumulated) -> None:
    accum, _, _ = accumulated
    first, second = accum[0]["metrics"], accum[1]["metrics"]
    assert first == second
    for key in ("train_loss", "train_accuracy", "train_samples_per_s", "eval_loss", "eval_accuracy"):
        assert key in first and first[key] >= 0, key
    assert first["train_samples"] == 64  # the whole epoch, both ranks
    assert 0 < first["train_samples_per_s"] < float("inf") and 0 <= first["eval_accuracy"] <= 1


def test_time_based_and_async_checkpoints_commit_on_all_ranks(accumulated) -> None:
    _, _, ckpt = accumulated
    for run in ("timed", "async"):
        steps = sorted(int(p.name[5:]) for p in (ckpt / run).glob("step-*"))
        assert steps and steps[-1] == 4, (run, steps)
        assert all((ckpt / run / f"step-{s}" / "COMPLETE").is_file() for s in steps)
    # Rank 0's clock said "due" at least once before the end (30 ms interval, lag of one step).
    assert len(list((ckpt / "timed").glob("step-*"))) >= 2


def test_checkpoint_holds_every_listed_item(one_process: None, tmp_path: Path) -> None:
    config = TrainConfig.from_argv(
        [*SMALL, "--batch-size", "8", "--checkpoint-dir", str(tmp_path), "--max-steps", "5", "--optimizer", "adamw"]
    )
    model = tiny_net(config.num_classes)
    fit(config, model, tiny_data(True, config), tiny_data(False, config))
    loaded = Checkpointer(tmp_path / "default", rank=0, world_size=1).latest()
    assert loaded is not None and loaded.step == 5 and loaded.world_size == 1
    shared = loaded.shared
    assert shared["model"].keys() == model.state_dict().keys()
    assert all(torch.equal(shared["model"][k], v) for k, v in model.state_dict().items())
    assert {"exp_avg", "exp_avg_sq", "step"} <= shared["optimizer"]["state"][0].keys()
    assert shared["scheduler"]["last_epoch"] == 5 and shared["scaler"] == {}
    assert (shared["epoch"], shared["step"], shared["batches_in_epoch"]) == (0, 5, 5)  # 8 per epoch
    assert shared["samples_in_epoch"] == 40 and shared["samples_seen"] == 40
    assert shared["sampler_seed"] == 11 and shared["world_size"] == 1
    assert shared["config"] == msgspec.to_builtins(config) and shared["version"] == __version__
    assert shared["metrics"]["train_samples"] == 40 and "eval_loss" in shared["metrics"]
    assert loaded.rank_state is not None and loaded.rank_state["rank"] == 0
    assert torch.is_tensor(loaded.rank_state["rng"]["torch"])
    # The flight recorder's settings held while it trained, no longer: a job this process starts
    # next (a notebook's local run) must not inherit them as the user's and dump into this folder.
    assert "TORCH_FR_DUMP_TEMP_FILE" not in os.environ and "TORCH_FR_BUFFER_SIZE" not in os.environ


def test_bf16_autocast_runs_on_cpu_and_fp16_is_refused(one_process: None) -> None:
    config = TrainConfig.from_argv([*SMALL, "--batch-size", "8", "--amp", "bf16", "--max-steps", "3"])
    model = plain_net(config.num_classes)
    dtypes: set[torch.dtype] = set()
    model[0].register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))
    metrics = fit(config, model, tiny_data(True, config), tiny_data(False, config))
    assert torch.bfloat16 in dtypes and torch.isfinite(torch.tensor(metrics["train_loss"]))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights stay fp32
    fp16 = TrainConfig.from_argv([*SMALL, "--amp", "fp16"])
    with pytest.raises(UsageError, match="fp16 needs a CUDA GPU"):
        fit(fp16, plain_net(10), tiny_data(True, fp16))


def test_loader_worker_processes_and_max_steps_mid_epoch(one_process: None) -> None:
    config = TrainConfig.from_argv([*SMALL, "--batch-size", "8", "--workers", "2", "--max-steps", "3"])
    metrics = fit(config, plain_net(10), tiny_data(True, config), tiny_data(False, config))
    assert (metrics["step"], metrics["epoch"], metrics["train_samples"]) == (3, 0, 24)
    assert "eval_loss" in metrics  # a run that max_steps ends mid-epoch is still evaluated


def test_progress_bar_on_a_terminal_and_missing_tensorboard_on_rank_0(
    one_process: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = TrainConfig.from_argv(
        [*SMALL, "--batch-size", "8", "--progress", "--tensorboard", "--checkpoint-dir", str(tmp_path), "--epochs", "1"]
    )
    to_a_log = TrainConfig.from_argv([*SMALL, "--batch-size", "8", "--progress", "--epochs", "1"])
    fit(to_a_log, plain_net(10), tiny_data(True, to_a_log))
    assert "/8" not in capsys.readouterr().err  # stderr is no terminal (a job log): no bar there
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with caplog.at_level(logging.INFO, logger="dist_jobs"):
        fit(config, plain_net(10), tiny_data(True, config))
    assert "8/8" in capsys.readouterr().err  # the bar reached the last step
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert "tensorboard package is not installed" in caplog.text
    else:
        assert any((tmp_path / "default" / "tensorboard").iterdir())


def test_resume_in_another_world_size_continues_by_sample_count(
    one_process: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = [
        "--model",
        "support.workloads:tiny_net",
        "--data",
        "support.workloads:tiny_data",
        *SMALL,
        "--batch-size",
        "4",
        "--checkpoint-dir",
        str(tmp_path),
        "--run-name",
        "grow",
    ]
    two = start_ranks([*args, "--max-steps", "3"], tmp_path)  # 2 ranks x 4: 24 samples seen
    assert wait_all(two, timeout=150) == [0, 0], two[0].text()[-3000:]
    assert final_state(tmp_path / "grow")["step"] == 3
    with caplog.at_level(logging.INFO, logger="dist_jobs"):
        fit(TrainConfig.from_argv(args))  # 1 rank x 4: 16 steps per epoch, resumes at the 7th
    assert "written by 2 ranks at sample 24 of the epoch; 1 ranks x batch 4 continue at sample 24" in caplog.text
    final = final_state(tmp_path / "grow")
    assert (final["step"], final["epoch"], final["world_size"]) == (3 + (16 - 6) + 16, 2, 1)
    assert final["samples_seen"] == 24 + 26 * 4


def test_a_new_run_removes_the_previous_result_and_owns_progress_from_its_start(
    one_process: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stale-result case: a run of the same name that fails must leave no earlier result.json,
    and progress.json is this job's and attempt's before its first log interval."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    run_dir = tmp_path / "default"
    run_dir.mkdir()
    (run_dir / "result.json").write_text('{"train_loss": 0.01}\n')
    (run_dir / "progress.json").write_text(json.dumps({"step": 99, "owner": "slurm:1", "attempt": 0}))
    seen: list[dict] = []

    def failing_loss(model: Any, batch: Any) -> Any:
        seen.append(json.loads((run_dir / "progress.json").read_text()))
        assert not (run_dir / "result.json").exists()
        raise RuntimeError("the user's loss fails")

    config = TrainConfig.from_argv([*SMALL, "--batch-size", "8", "--checkpoint-dir", str(tmp_path)])
    with pytest.raises(RuntimeError, match="the user's loss fails"):
        fit(config, tiny_net(config.num_classes), tiny_data(True, config), loss=failing_loss)
    assert not (run_dir / "result.json").exists()
    assert (seen[0]["owner"], seen[0]["attempt"], seen[0]["step"]) == ("slurm:77", 2, 0)


def test_each_logged_row_is_its_own_steps_so_a_resumed_run_logs_the_same_curve(
    one_process: None, tmp_path: Path
) -> None:
    """A log row's loss and throughput are those of the steps since the row before, not a running
    mean of the epoch: the plotted curve has no step where an epoch starts, nor where a resumed run
    begins again. A run stopped at step 4 and resumed logs the very rows of a run that never stopped."""

    def rows(name: str, *stops: int) -> dict[int, dict[str, float]]:
        for stop in stops:
            args = [*SMALL, "--batch-size", "8", "--checkpoint-dir", str(tmp_path), "--run-name", name]
            config = TrainConfig.from_argv(
                [*args, "--log-every", "2", "--scheduler", "constant", "--max-steps", str(stop)]
            )
            torch.manual_seed(0)
            fit(config, tiny_net(config.num_classes), tiny_data(True, config), tiny_data(False, config))
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        logged = [row for row in map(json.loads, lines) if "loss" in row.get("metrics", {})]
        return {row["step"]: row["metrics"] for row in logged}  # the log rows, not the epochs' ends

    whole, resumed = rows("whole", 10), rows("resumed", 4, 10)
    assert sorted(whole) == [2, 4, 6, 8, 10], whole  # 8 steps an epoch: step 10 is in the second
    assert all(resumed[step]["loss"] == whole[step]["loss"] for step in whole), (resumed, whole)
    assert all(resumed[step]["accuracy"] == whole[step]["accuracy"] for step in whole), (resumed, whole)
