"""fit() beyond image classification: your own loss, model and batch structure, metrics averaged
across ranks, your own checkpointed state, gradient clipping, bf16 on CPU, torch.compile, and the
built-in language model. The 2-rank runs use tests/support/regression_job.py, a user script."""

from __future__ import annotations

import random
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from msgspec.structs import replace
from torch import nn

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.checkpoint.write import CheckpointError
from dist_jobs.train.loop import fit
from support.paths import PYTHON, TESTS
from support.regression_job import EMA, Points, Regressor, mse
from support.train_support import assert_bit_identical, clipped_sgd_step, preempted_why, start_ranks, wait_all
from support.waiting import eventually

# Its tests share one module-scoped reference run: one xdist worker runs them all.
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("test_fit_general")]

JOB = TESTS / "support" / "regression_job.py"
TOTAL = 18  # 96 samples / 2 ranks / batch 8 = 6 steps an epoch, 3 epochs


def flags(checkpoints: Path) -> list[str]:
    return [
        "--batch-size",
        "8",
        "--epochs",
        "3",
        "--deterministic",
        "--seed",
        "4",
        "--log-every",
        "1",
        "--no-progress",
        "--lr",
        "0.05",
        "--optimizer",
        "adamw",
        "--grad-clip",
        "1.0",
        "--checkpoint-every-steps",
        "4",
        "--checkpoint-dir",
        str(checkpoints),
        "--run-name",
        "regress",
    ]


def run_job(root: Path, checkpoints: Path, **extra: str) -> list[Any]:
    root.mkdir(parents=True, exist_ok=True)
    ranks = start_ranks(flags(checkpoints), root, command=[PYTHON, str(JOB), str(root)], **extra)
    codes = wait_all(ranks, timeout=150)
    assert codes == [0, 0], ranks[0].text()[-3000:]
    return [torch.load(root / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    root = tmp_path_factory.mktemp("reference")
    return run_job(root, root / "ckpt")


def test_user_loss_metrics_are_averaged_over_all_ranks(reference: list[Any]) -> None:
    first, second = (r["metrics"] for r in reference)
    assert first == second  # the same numbers on every rank
    assert first["train_rank"] == pytest.approx(0.5)  # ranks 0 and 1, equal samples: all_reduced
    assert {"train_loss", "train_mae", "eval_loss", "eval_mae"} <= set(first)
    assert first["eval_loss"] < 0.5 and first["step"] == TOTAL


def test_sigterm_mid_epoch_resumes_dict_batches_bit_identically(reference: list[Any], tmp_path: Path) -> None:
    """Slow by nature: the job runs twice (interrupted, then resumed), each time two ranks starting torch, and the
    first run is slowed to 0.3 s a step so the signal lands mid-epoch."""
    # The ranks stop one to a few boundaries after the signal (the flag's all_reduce is a step
    # late, and a loaded machine adds more): signalled one step into the second epoch (steps
    # 7-12), they stop inside it, steps slow enough that a late signal still lands there. A
    # random step once landed the stop on an epoch's end.
    stop_at, target = 7, random.randint(0, 1)
    print(f"SIGTERM to rank {target} once rank 0 logged step {stop_at}")
    (tmp_path / "first").mkdir()
    ranks = start_ranks(
        flags(tmp_path / "ckpt"),
        tmp_path / "first",
        command=[PYTHON, str(JOB), str(tmp_path)],
        DJ_TEST_STEP_DELAY="0.3",
    )
    eventually(
        lambda: ranks[0].last_step() >= stop_at,
        timeout=90,
        interval=0.02,
        what=f"rank 0's step {stop_at}",
        give_up=lambda: [r.proc.returncode for r in ranks if r.proc.poll() is not None],
        context=lambda: ranks[0].text()[-3000:],
    )
    ranks[target].proc.send_signal(signal.SIGTERM)
    assert wait_all(ranks, timeout=60) == [REQUEUE_EXIT_CODE] * 2, ranks[0].text()[-3000:]
    stopped = int(preempted_why(tmp_path / "ckpt" / "regress"))
    assert stop_at < stopped < TOTAL and stopped % 6, "not mid-epoch"  # 6 steps an epoch
    resumed = run_job(tmp_path, tmp_path / "ckpt")
    for got, want in zip(resumed, reference):
        assert_bit_identical(got["model"], want["model"], "model")
        assert_bit_identical(got["ema"], want["ema"], "user state (EMA)")
        assert got["ema"]["updates"] == want["ema"]["updates"] == TOTAL * 1  # one per micro-batch


def test_gradient_clipping_bounds_the_step(one_process: None) -> None:
    torch.manual_seed(0)
    model = Regressor()
    before = [p.detach().clone() for p in model.parameters()]
    fit(clipped_sgd_step(), model, Points(8), loss=mse)
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)]).norm()
    assert 0 < moved <= 1e-3 * (1 + 1e-5)  # SGD: step = lr x clipped gradient


def test_bf16_autocast_runs_on_cpu(one_process: None) -> None:
    seen: list[torch.dtype] = []

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(batch["x"])
        seen.append(out.dtype)
        return ((out.float() - batch["y"]) ** 2).mean()

    config = TrainConfig(amp="bf16", max_steps=3, batch_size=8, progress=False, eval_every_epoch=False, device="cpu")
    fit(config, Regressor(), Points(32), loss=loss)
    assert seen and set(seen) == {torch.bfloat16}


def test_user_state_missing_from_the_checkpoint_is_a_clear_error(one_process: None, tmp_path: Path) -> None:
    config = TrainConfig(
        max_steps=2,
        batch_size=8,
        progress=False,
        eval_every_epoch=False,
        device="cpu",
        checkpoint_dir=str(tmp_path),
        run_name="r",
        checkpoint_every_steps=1,
    )
    fit(config, Regressor(), Points(16), loss=mse)
    model = Regressor()
    with pytest.raises(CheckpointError, match=r"holds no state for \['ema'\]") as caught:
        fit(config, model, Points(16), loss=mse, state={"ema": EMA(model)})
    assert "state=" in (getattr(caught.value, "hint", "") or "")


# The built-in GPT on the generated text, on the CPU: each test sets its size and length.
SMALL_GPT = TrainConfig(
    model="gpt", data="text", gpt_layers=2, gpt_heads=2, lr=3e-3, optimizer="adamw", progress=False, device="cpu"
)


def test_language_model_learns_in_a_few_cpu_steps(one_process: None) -> None:
    """The built-in GPT learns the generated grammar (eval loss below 2.2, against ln(96) = 4.56 for a guess). Slow
    by nature: 120 CPU steps is what that takes."""
    config = replace(
        SMALL_GPT,
        gpt_width=64,
        seq_len=64,
        text_chars=60_000,
        batch_size=16,
        max_steps=120,
        epochs=100,
        weight_decay=0.0,
        warmup_steps=10,
    )
    metrics = fit(config)
    # Uniform over the 96 characters is ln(96) = 4.56; the grammar makes it far more predictable.
    assert metrics["eval_loss"] < 2.2, metrics
    assert metrics["train_tokens_per_s"] > 0 and metrics["train_tokens"] > 0


@pytest.mark.slow
def test_torch_compile_is_opt_in_and_trains(one_process: None) -> None:
    config = replace(
        SMALL_GPT,
        gpt_layers=1,
        gpt_width=32,
        seq_len=32,
        text_chars=20_000,
        batch_size=8,
        max_steps=6,
        epochs=10,
        compile=True,
        eval_every_epoch=False,
    )
    metrics = fit(config)
    assert metrics["step"] == 6 and metrics["train_loss"] < 4.6
