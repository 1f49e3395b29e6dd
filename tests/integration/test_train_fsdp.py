"""strategy fsdp (FSDP2, gloo, CPU): sharded checkpoints that resume exactly, on another world size,
and across strategies; and their export to one plain state dict.

The job: the built-in GPT (2 blocks, width 32; support.workloads:slow_gpt) on the generated
text, AdamW, gradient accumulation 2 and clipping, a global batch of 8 x 2 samples on any world
size (2 ranks x batch 4, 4 ranks x batch 2), 14 steps. Every run starts from the same weights
(fsdp.materialise initialises whole-size, whatever the world size or strategy) and sees the same
samples in each step (data.ResumableSampler), so runs that differ only in how the work was split
differ only in rounding. The random step of each signal is printed, so a failure can be replayed.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from dist_jobs.constants import REQUEUE_EXIT_CODE
from support.train_support import (
    PYTHON,
    Launch,
    assert_bit_identical,
    child_env,
    clipped_sgd_step,
    kill_all,
    max_difference,
    newest_state,
    preempted_why,
    start_ranks,
    wait_all,
)
from support.waiting import HUNG_S, eventually
from support.workloads import slow_gpt

# Its tests share one module-scoped reference run: one xdist worker runs them all.
pytestmark = [pytest.mark.timeout(HUNG_S), pytest.mark.xdist_group("test_train_fsdp")]

TOTAL = 14  # 224 chunks of 16 tokens / 16 samples per step, one epoch
DELAY = {"DJ_TEST_STEP_DELAY": "0.1"}  # per forward (2 a step): time to aim a signal, same numbers
# Another world size or strategy adds up the same gradients in another order: the last bits
# differ, and 14 AdamW steps carry that far below this (measured: about 1e-6).
TOLERANCE = 1e-4
STEP_RE = re.compile(r"step (\d+)/\d+ epoch \d+ train")


def job(checkpoints: Path, world: int, strategy: str = "fsdp", *extra: str) -> list[str]:
    return [
        *extra,
        *("--model", "support.workloads:slow_gpt", "--data", "text", "--seq-len", "16"),
        *("--text-chars", "4000", "--batch-size", str(8 // world), "--grad-accum", "2", "--epochs", "1"),
        *("--optimizer", "adamw", "--lr", "0.01", "--warmup-steps", "2", "--grad-clip", "1.0"),
        *("--deterministic", "--seed", "3", "--log-every", "1", "--no-progress"),
        *("--strategy", strategy, "--checkpoint-every-steps", "5"),
        *("--checkpoint-dir", str(checkpoints), "--run-name", "fsdp"),
    ]


def held_out_loss(run_dir: Path) -> float:
    """The final model's loss on the held-out text (result.json; the train loss logged is a
    running mean since the start of the epoch, or of the resumed run)."""
    return float(json.loads((run_dir / "result.json").read_text())["eval_loss"])


def last_step(launch: Launch) -> int:
    return max((int(m.group(1)) for m in STEP_RE.finditer(launch.text())), default=0)


def run(root: Path, world: int, strategy: str = "fsdp", *extra: str) -> list[Launch]:
    root.mkdir(parents=True, exist_ok=True)
    launches = start_ranks(job(root.parent / "ckpt", world, strategy, *extra), root, world=world)
    codes = wait_all(launches, timeout=150)
    assert codes == [0] * world, launches[0].text()[-3000:]
    return launches


def preempt(root: Path, world: int, after: int, strategy: str = "fsdp", *extra: str) -> tuple[int, list[Launch]]:
    """Run until rank 0 logged step `after`, SIGTERM a random rank: the step it checkpointed at."""
    root.mkdir(parents=True, exist_ok=True)
    target = random.Random().randrange(world)
    print(f"SIGTERM to rank {target} of {world} once rank 0 logged step {after}")
    launches = start_ranks(job(root.parent / "ckpt", world, strategy, *extra), root, world=world, **DELAY)
    eventually(
        lambda: last_step(launches[0]) >= after,
        timeout=120,
        interval=0.02,
        what=f"step {after}",
        give_up=lambda: [launch.proc.returncode for launch in launches if launch.proc.poll() is not None],
        on_timeout=lambda: kill_all(launches),
        context=lambda: launches[0].text()[-3000:],
    )
    launches[target].proc.send_signal(signal.SIGTERM)
    assert wait_all(launches, timeout=60) == [REQUEUE_EXIT_CODE] * world, launches[0].text()[-3000:]
    marker = int(preempted_why(root.parent / "ckpt" / "fsdp"))
    assert after < marker < TOTAL, f"checkpointed at step {marker}"
    return marker, launches


def copy_run(source: Path, into: Path) -> Path:
    """The checkpoints of a run directory, for another run to resume (no lock, no records)."""
    shutil.copytree(source / "ckpt" / "fsdp", into / "ckpt" / "fsdp", ignore=shutil.ignore_patterns("LOCK*"))
    return into / "ckpt" / "fsdp"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted 2-rank FSDP run every resume here is compared with (once per module: it
    takes two ranks starting torch and training to the end)."""
    root = tmp_path_factory.mktemp("reference")
    run(root / "logs", 2)
    state = newest_state(root / "ckpt" / "fsdp")
    assert state["shared"]["step"] == TOTAL and state["shared"]["format"] == "dcp"
    return {**state, "dir": root / "ckpt" / "fsdp", "loss": held_out_loss(root / "ckpt" / "fsdp")}


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A 2-rank FSDP run stopped by SIGTERM at a random early step, with asynchronous sharded
    checkpoints: the run several tests resume (once per module: it is a whole run up to the stop)."""
    root = tmp_path_factory.mktemp("preempted")
    # Asynchronous checkpoints (dcp.async_save): the preemption's must be committed before PREEMPTED.
    marker, _ = preempt(root / "logs", 2, random.Random().randint(2, 6), "fsdp", "--async-checkpoint")
    folder = root / "ckpt" / "fsdp" / f"step-{marker}"
    assert (folder / "COMPLETE").is_file() and (folder / ".metadata").is_file()
    assert sorted(p.name for p in folder.glob("__*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    return root, marker


def test_sigterm_mid_epoch_then_resume_on_the_same_world_is_bit_identical(
    reference: dict[str, Any], preempted: tuple[Path, int], tmp_path: Path
) -> None:
    source, marker = preempted
    run_dir = copy_run(source, tmp_path)
    resumed = run(tmp_path / "logs", 2)
    assert f"resumed from {run_dir / f'step-{marker}'}" in resumed[0].text()
    final = newest_state(run_dir)
    assert_bit_identical(final["model"], reference["model"], "model")
    assert_bit_identical(final["optimizer"], reference["optimizer"], "optimizer")
    assert_bit_identical(final["shared"]["scheduler"], reference["shared"]["scheduler"], "scheduler")


def test_on_4_ranks_a_resume_is_bit_identical_too(tmp_path: Path) -> None:
    """The uninterrupted 4-rank run's own step-5 checkpoint, resumed alone on 4 ranks, ends on the
    same bits as that run (2 steps later: model, AdamW state, schedule, data position, RNG).
    Slow by nature: two runs of four ranks each, each rank starting torch."""
    short = ("--max-steps", "7")
    run(tmp_path / "whole" / "logs", 4, "fsdp", *short)
    reference = newest_state(tmp_path / "whole" / "ckpt" / "fsdp")
    assert reference["shared"]["step"] == 7 and reference["shared"]["world_size"] == 4
    run_dir = copy_run(tmp_path / "whole", tmp_path / "again")
    shutil.rmtree(run_dir / "step-7")
    resumed = run(tmp_path / "again" / "logs", 4, "fsdp", *short)
    assert f"resumed from {run_dir / 'step-5'}" in resumed[0].text()
    final = newest_state(run_dir)
    assert final["shared"]["step"] == 7
    assert_bit_identical(final["model"], reference["model"], "model")
    assert_bit_identical(final["optimizer"], reference["optimizer"], "optimizer")
    assert_bit_identical(final["shared"]["scheduler"], reference["shared"]["scheduler"], "scheduler")


DAMAGES = [("truncate", "__0_0.distcp"), ("flip", "__1_0.distcp"), ("flip", ".metadata")]


@pytest.mark.parametrize(("damage", "name"), DAMAGES)
def test_a_damaged_dcp_file_in_the_newest_checkpoint_falls_back_to_the_previous_one(
    reference: dict[str, Any], tmp_path: Path, damage: str, name: str
) -> None:
    """Every rank resumes from step-10, the rank that checked the file says which one is damaged,
    and the run ends on the uninterrupted run's bits (it rewrites step-14)."""
    run_dir = tmp_path / "ckpt" / "fsdp"
    shutil.copytree(reference["dir"], run_dir, ignore=shutil.ignore_patterns("LOCK*"))
    path = run_dir / f"step-{TOTAL}" / name
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    resumed = run(tmp_path / "logs", 2)
    logs = "".join(launch.text() for launch in resumed)
    said = rf"checkpoint {re.escape(str(path.parent))} is unusable on rank \d: {re.escape(name)} is damaged"
    assert re.search(said, logs), logs[-3000:]
    assert f"resumed from {run_dir / 'step-10'}" in resumed[0].text()
    final = newest_state(run_dir)
    assert final["shared"]["step"] == TOTAL
    assert_bit_identical(final["model"], reference["model"], "model")


def test_resharded_2_to_4_then_4_to_2_continues_the_loss(
    reference: dict[str, Any], preempted: tuple[Path, int], tmp_path: Path
) -> None:
    """Slow by nature: three runs (two ranks, then four, then two again), each starting torch in every rank."""
    source, first = preempted
    run_dir = copy_run(source, tmp_path)
    second, on_four = preempt(tmp_path / "four", 4, after=min(first + 2, TOTAL - 2))
    assert f"resumed from {run_dir / f'step-{first}'}" in on_four[0].text()
    assert "it was written by 2 ranks" in on_four[0].text()
    assert '"world_size": 4' in (run_dir / f"step-{second}" / "COMPLETE").read_text()
    back = run(tmp_path / "two", 2)
    assert f"resumed from {run_dir / f'step-{second}'}" in back[0].text()
    final = newest_state(run_dir)
    print(f"model max |diff| vs the uninterrupted 2-rank run: {max_difference(final['model'], reference['model'])}")
    assert max_difference(final["model"], reference["model"]) < TOLERANCE
    assert abs(held_out_loss(run_dir) - reference["loss"]) < TOLERANCE


def test_a_sharded_checkpoint_resumes_under_ddp(
    reference: dict[str, Any], preempted: tuple[Path, int], tmp_path: Path
) -> None:
    source, marker = preempted
    run_dir = copy_run(source, tmp_path)
    resumed = run(tmp_path / "logs", 2, strategy="ddp")
    assert f"resumed from {run_dir / f'step-{marker}'}" in resumed[0].text()
    final = newest_state(run_dir)
    assert final["shared"]["format"] == "whole"
    assert max_difference(final["model"], reference["model"]) < TOLERANCE


def test_a_ddp_checkpoint_resumes_under_fsdp(reference: dict[str, Any], tmp_path: Path) -> None:
    """Slow by nature: two runs of two ranks (DDP interrupted, then FSDP resumed), each starting torch."""
    marker, _ = preempt(tmp_path / "ddp", 2, after=random.Random().randint(2, 6), strategy="ddp")
    run_dir = tmp_path / "ckpt" / "fsdp"
    assert newest_state(run_dir)["shared"]["format"] == "whole"
    resumed = run(tmp_path / "fsdp", 2)
    assert f"resumed from {run_dir / f'step-{marker}'}" in resumed[0].text()
    final = newest_state(run_dir)
    assert final["shared"]["format"] == "dcp"
    assert max_difference(final["model"], reference["model"]) < TOLERANCE
    assert abs(held_out_loss(run_dir) - reference["loss"]) < TOLERANCE


def test_export_gives_a_plain_model_the_trained_outputs(reference: dict[str, Any], tmp_path: Path) -> None:
    """Named by the job's handle (a local run's is its run directory; the damaged-shard test below
    names the folder itself).
    Slow by nature: two exports, each a fresh `dist-jobs export` process that starts torch and reads the sharded
    checkpoint."""
    out = tmp_path / "model.pt"
    cli = [PYTHON, "-m", "dist_jobs", "export", f"local://{reference['dir']}", "-o", str(out)]
    done = subprocess.run(cli, env=child_env(), capture_output=True, text=True, timeout=HUNG_S)
    assert done.returncode == 0, done.stderr
    assert f"step-{TOTAL}" in done.stdout
    exported = torch.load(out, weights_only=True)
    plain, whole = slow_gpt(), slow_gpt()
    plain.load_state_dict(exported)  # strict: every key, nothing else
    whole.load_state_dict(reference["model"])  # torch's own consolidation of the same shards
    tokens = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(plain.eval()(tokens), whole.eval()(tokens))
    assert not torch.equal(plain(tokens), slow_gpt().eval()(tokens))  # trained, not the initial weights

    older = subprocess.run([*cli[:-1], str(tmp_path / "old.pt"), "--step", "5"], env=child_env(), capture_output=True)
    assert older.returncode == 0 and not torch.equal(
        torch.load(tmp_path / "old.pt")["head.weight"], exported["head.weight"]
    )


def test_export_refuses_a_checkpoint_with_a_damaged_shard(reference: dict[str, Any], tmp_path: Path) -> None:
    """Whichever rank wrote the damaged shard (rank 0's here), export says so instead of writing
    a model from it; an older step still exports."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference["dir"], run_dir, ignore=shutil.ignore_patterns("LOCK*"))
    shard = run_dir / f"step-{TOTAL}" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    cli = [PYTHON, "-m", "dist_jobs", "export", str(run_dir), "-o", str(tmp_path / "model.pt")]
    done = subprocess.run(cli, env=child_env(), capture_output=True, text=True, timeout=HUNG_S)
    assert done.returncode != 0 and "__0_0.distcp is damaged" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "model.pt").exists()
    older = subprocess.run([*cli, "--step", "10"], env=child_env(), capture_output=True, text=True, timeout=HUNG_S)
    assert older.returncode == 0, older.stderr


def test_fit_shards_a_users_materialised_model_and_clips_its_sharded_gradients(one_process: None) -> None:
    from torch.distributed.tensor import DTensor

    from dist_jobs.train.loop import fit
    from support.regression_job import Points, Regressor, mse

    torch.manual_seed(0)
    model = Regressor()
    before = [p.detach().clone() for p in model.parameters()]
    fit(clipped_sgd_step(strategy="fsdp"), model, Points(8), loss=mse)
    assert all(isinstance(p, DTensor) for p in model.parameters())  # sharded in place
    after = [p.full_tensor() for p in model.parameters()]  # type: ignore[attr-defined]
    moved = torch.cat([(a - b).flatten() for a, b in zip(after, before)]).norm()
    assert 0 < moved <= 1e-3 * (1 + 1e-5)  # SGD: step = lr x the clipped norm of the whole gradient


def test_fit_under_fsdp_bf16_computes_in_bf16_and_hands_the_loss_fp32(one_process: None) -> None:
    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.loop import fit
    from support.regression_job import Points, Regressor

    compute: list[torch.dtype] = []
    outputs: list[torch.dtype] = []

    def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(batch["x"])
        outputs.append(out.dtype)
        return ((out - batch["y"]) ** 2).mean()

    model = Regressor()
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_pre_hook(lambda module, _: compute.append(module.weight.dtype))
    config = TrainConfig(
        strategy="fsdp", amp="bf16", max_steps=2, batch_size=8, progress=False, eval_every_epoch=False, device="cpu"
    )
    fit(config, model, Points(32), loss=loss)
    assert set(compute) == {torch.bfloat16} and set(outputs) == {torch.float32}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the sharded master weights stay fp32


@pytest.mark.parametrize("async_write", [False, True])
def test_a_sharded_save_is_fenced_by_the_run_directory_lock(tmp_path: Path, async_write: bool) -> None:
    """Once the lock is lost, no shard, file or commit of a later step reaches the run directory."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from dist_jobs.rundir.lock import LockLost
    from dist_jobs.train.checkpoint.sharded import ShardedCheckpointer, sharded_state

    run_dir = tmp_path / "run"
    fenced: list[str] = []

    def fence(doing: str) -> None:
        fenced.append(doing)
        if lost:
            raise LockLost(run_dir, None, doing)

    lost = False
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = fully_shard(nn.Linear(4, 4))
        optimizer = torch.optim.AdamW(model.parameters())
        ckpt = ShardedCheckpointer(run_dir, rank=0, world_size=1, fence=fence, async_write=async_write)
        ckpt.save(1, {"step": 1}, {"rank": 0}, sharded_state(model, optimizer))
        ckpt.wait()
        assert (run_dir / "step-1" / "COMPLETE").is_file() and (run_dir / "step-1" / ".metadata").is_file()
        assert any("shards" in doing for doing in fenced)
        lost = True
        with pytest.raises(LockLost):
            ckpt.save(2, {"step": 2}, {"rank": 0}, sharded_state(model, optimizer))
            ckpt.wait()
        assert sorted(p.name for p in run_dir.iterdir()) == ["latest", "step-1"]
    finally:
        dist.destroy_process_group()


class CountingBlock(torch.nn.Module):
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CountingBlock.calls += 1
        return torch.tanh(self.linear(x)) + x


class BlockNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(CountingBlock() for _ in range(3))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fit_materialises_a_users_meta_model_and_recomputes_blocks_with_activation_checkpointing(
    one_process: None, checkpointing: bool
) -> None:
    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.loop import fit
    from support.regression_job import Points, mse

    with torch.device("meta"):
        model = BlockNet()
    config = TrainConfig(
        strategy="fsdp",
        activation_checkpointing=checkpointing,
        max_steps=2,
        batch_size=8,
        progress=False,
        eval_every_epoch=False,
        device="cpu",
    )
    CountingBlock.calls = 0
    fit(config, model, Points(16), loss=mse)
    assert not any(p.is_meta for p in model.parameters())
    assert all(torch.isfinite(p.full_tensor()).all() for p in model.parameters())  # type: ignore[attr-defined]
    assert CountingBlock.calls == 3 * 2 * (2 if checkpointing else 1)  # 3 blocks, 2 steps, + the recomputation


def test_each_rank_file_vouches_for_its_dcp_files_and_a_load_fails_on_every_rank_together(tmp_path: Path) -> None:
    """rank-0.pt records size and CRC32 of the shards rank 0 wrote and of DCP's .metadata; a rank
    that read its shards still raises when another rank could not (the all_reduce agrees)."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from dist_jobs.train.checkpoint.sharded import ShardedCheckpointer, load_sharded, sharded_state
    from dist_jobs.train.checkpoint.write import digest

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = fully_shard(nn.Linear(4, 4))
        optimizer = torch.optim.AdamW(model.parameters())
        ckpt = ShardedCheckpointer(tmp_path, rank=0, world_size=1)
        ckpt.save(1, {"step": 1}, {"rank": 0}, sharded_state(model, optimizer))
        ckpt.close()
        folder = tmp_path / "step-1"
        files = torch.load(folder / "rank-0.pt", weights_only=True)["files"]
        assert files == {name: digest(folder / name) for name in ("__0_0.distcp", ".metadata")}
        load_sharded(model, optimizer, folder, agree=lambda flags: flags)
        with pytest.raises(RuntimeError, match="another rank could not read its part"):
            load_sharded(model, optimizer, folder, agree=lambda flags: [1])
    finally:
        dist.destroy_process_group()
