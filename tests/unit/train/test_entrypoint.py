"""The training runtime's parts, one at a time, in this process (no launches but one)."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_jobs.errors import UsageError
from dist_jobs.ranks.ports import free_port
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import data, models
from dist_jobs.train.__main__ import main
from dist_jobs.train.distributed import FlagPoll
from dist_jobs.train.resume import checkpoint_folder
from dist_jobs.train.signals import PreemptFlag, parse_signal
from support.train_support import PYTHON, REPO, child_env
from support.waiting import HUNG_S


# -- signals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["SIGUSR1", "USR1", "usr1", str(int(signal.SIGUSR1))])
def test_parse_signal_accepts_names_with_or_without_sig_and_numbers(name: str) -> None:
    assert parse_signal(name) is signal.SIGUSR1


@pytest.mark.parametrize(("name", "says"), [("SIGFOO", "not a signal"), ("SIGKILL", "cannot be caught")])
def test_parse_signal_refuses_unknown_and_uncatchable(name: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as error:
        parse_signal(name)
    assert "preempt_signals" in error.value.message and error.value.hint


def test_preempt_flag_only_records_and_restores_the_previous_handler() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        with PreemptFlag(["SIGUSR2", "SIGTERM"]) as flag:
            assert not flag
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGTERM)  # the process lives on: only a flag is set
            assert flag and flag.received is signal.SIGUSR2
            assert seen == []
        os.kill(os.getpid(), signal.SIGUSR2)
        assert seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


# -- sampler and resume position ---------------------------------------------------------------
def _order(sampler: data.ResumableSampler, epoch: int, skip: int = 0) -> list[int]:
    sampler.set_epoch(epoch, skip=skip)
    return list(sampler)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_resumable_sampler_skips_exactly_the_consumed_prefix(world: int) -> None:
    dataset = list(range(50))
    for rank in range(world):
        sampler = data.ResumableSampler(dataset, num_replicas=world, rank=rank, seed=5)
        full = _order(sampler, epoch=2)
        assert _order(sampler, epoch=2, skip=7) == full[7:]
        assert len(sampler) == len(full) - 7
        assert _order(sampler, epoch=3) != full  # a new epoch, a new order


def test_resume_by_sample_count_in_another_world_size_skips_no_sample() -> None:
    """2 ranks x batch 4 did 3 steps; 3 ranks x batch 2 continue: together they see everything."""
    dataset, epoch = list(range(60)), 1
    old = [data.ResumableSampler(dataset, num_replicas=2, rank=r, seed=9) for r in range(2)]
    seen = [i for s in old for i in _order(s, epoch)[: 3 * 4]]
    config = TrainConfig(batch_size=2, grad_accum=1, seed=9)
    skip = data.resume_batches(3 * 4 * 2, config, world_size=3, epoch_steps=10)
    assert skip == 4  # floor(24 samples / (2 x 3)) batches of 2
    new = [data.ResumableSampler(dataset, num_replicas=3, rank=r, seed=9) for r in range(3)]
    rest = [i for s in new for i in _order(s, epoch, skip=skip * 2)]
    assert set(seen) | set(rest) == set(dataset)
    assert len(seen) + len(rest) == len(dataset)  # 24 seen, 36 left: none twice here


def test_resume_batches_rounds_to_a_whole_accumulation_group_and_caps() -> None:
    config = TrainConfig(batch_size=4, grad_accum=3)
    assert data.resume_batches(4 * 2 * 7, config, world_size=2, epoch_steps=5) == 6
    assert data.resume_batches(10**6, config, world_size=2, epoch_steps=5) == 15


# -- LR schedule -------------------------------------------------------------------------------
def _lrs(config: TrainConfig, total: int, steps: int) -> list[float]:
    optimizer = models.build_optimizer(config, torch.nn.Linear(2, 2), world_size=1)
    schedule = models.build_schedule(config, optimizer, total)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def test_schedule_warms_up_linearly_then_follows_cosine_to_zero() -> None:
    lrs = _lrs(TrainConfig(lr=0.4, warmup_steps=4, scheduler="cosine"), total=12, steps=12)
    assert lrs[:4] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert lrs[4:] == pytest.approx([0.2 * (1 + math.cos(math.pi * k / 8)) for k in range(8)])


def test_scale_lr_uses_the_global_batch_and_step_schedule_decays_twice() -> None:
    lrs = _lrs(TrainConfig(lr=0.1, scale_lr=True, batch_size=64, grad_accum=2, scheduler="step"), total=9, steps=9)
    assert lrs == pytest.approx([0.05] * 3 + [0.005] * 3 + [0.0005] * 3)  # 0.1 x 128/256


def test_seek_schedule_lands_where_stepping_would() -> None:
    config = TrainConfig(lr=0.3, warmup_steps=2)
    optimizer = models.build_optimizer(config, torch.nn.Linear(2, 2), world_size=1)
    schedule = models.build_schedule(config, optimizer, total_steps=20)
    models.seek_schedule(schedule, 7)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(_lrs(config, 20, 8)[7])
    assert schedule.last_epoch == 7


# -- process-group helpers ---------------------------------------------------------------------
@pytest.fixture
def world_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_flag_poll_reports_a_launch_at_the_next_result(world_of_one: None) -> None:
    poll = FlagPoll(None, 2)
    assert poll.result() == [False, False]  # nothing launched yet
    poll.launch([True, False])
    assert poll.result() == [True, False]
    poll.launch([False, True])
    poll.drain()
    assert poll.result() == [False, False]


# -- names, models, data -----------------------------------------------------------------------
def test_checkpoint_folder_prefers_config_then_environment() -> None:
    env = {"DIST_JOBS_CHECKPOINT_DIR": "/ck", "DIST_JOBS_RUN": "job-7"}
    assert checkpoint_folder(TrainConfig(), env) == Path("/ck/job-7")
    assert checkpoint_folder(TrainConfig(checkpoint_dir="/x", run_name="r"), env) == Path("/x/r")
    assert checkpoint_folder(TrainConfig(checkpoint_dir="/x"), {}) == Path("/x/default")
    assert checkpoint_folder(TrainConfig(), {}) is None


@pytest.mark.parametrize("name", ["../x", "/abs", "..", "a/b", ".hidden", "r 1 ü"])
def test_checkpoint_folder_never_leaves_the_root(name: str) -> None:
    """A TrainConfig built in Python and a hand-set $DIST_JOBS_RUN skip the spec's checks."""
    with pytest.raises(UsageError, match=re.escape("is not a run name: it must match [A-Za-z0-9_]")):
        checkpoint_folder(TrainConfig(checkpoint_dir="/ck", run_name=name))
    with pytest.raises(UsageError, match="DIST_JOBS_RUN"):
        checkpoint_folder(TrainConfig(), {"DIST_JOBS_CHECKPOINT_DIR": "/ck", "DIST_JOBS_RUN": name})


def test_checkpoint_folder_keeps_the_root_as_written_and_refuses_a_file(tmp_path: Path) -> None:
    env = {"DIST_JOBS_CHECKPOINT_DIR": "/ck \n", "DIST_JOBS_RUN": "r"}
    assert checkpoint_folder(TrainConfig(), env) == Path("/ck \n/r")  # as the batch script and pod have it
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="not a folder"):
        checkpoint_folder(TrainConfig(checkpoint_dir=str(tmp_path / "file")), {})


def test_torchvision_model_by_name_and_factories() -> None:
    net = models.build_model("resnet18", num_classes=7)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    tiny = models.build_model("support.workloads:tiny_net", num_classes=5)
    assert tiny(torch.zeros(2, 3, 8, 8)).shape == (2, 5)
    with pytest.raises(UsageError, match="resnet18"):  # suggested
        models.build_model("resnet19", 10)
    with pytest.raises(UsageError, match="cannot import module 'no_such_module'"):
        models.build_model("no_such_module:make", 10)
    with pytest.raises(UsageError, match="has no attribute"):
        models.build_model("support.train_support:nothing_here", 10)
    with pytest.raises(UsageError, match="not an nn.Module"):
        models.build_model("support.train_support:free_port", 10)


def test_fake_data_is_the_same_on_every_build_and_train_differs_from_eval() -> None:
    config = TrainConfig(fake_samples=20, image_size=16, num_classes=4, seed=1)
    (train, held_out), (again, _) = data.build_datasets(config), data.build_datasets(config)
    assert len(train) == 20 and len(held_out) == 5
    assert torch.equal(train[3][0], again[3][0]) and train[3][1] == again[3][1]
    assert train[3][0].shape == (3, 16, 16) and not torch.equal(train[0][0], held_out[0][0])


def test_fake_data_matches_torchvision_without_reseeding_any_global_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision import datasets, transforms

    stock = datasets.FakeData(
        size=6, image_size=(3, 8, 8), num_classes=5, random_offset=2, transform=transforms.ToTensor()
    )
    want = [stock[i] for i in range(6)]

    def forbidden(seed: int) -> None:
        raise AssertionError("torch.manual_seed would reset the CUDA generators too")

    monkeypatch.setattr(torch, "manual_seed", forbidden)
    train, _ = data.build_datasets(TrainConfig(fake_samples=6, image_size=8, num_classes=5, seed=2))
    for (image, label), (stock_image, stock_label) in zip((train[i] for i in range(6)), want):
        assert torch.equal(image, stock_image) and label == stock_label


def test_datasets_on_disk_need_a_root_and_never_download_unasked(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="data_root is not set"):
        data.build_datasets(TrainConfig(data="cifar10"))
    with pytest.raises(UsageError, match="--download") as error:
        data.build_datasets(TrainConfig(data="cifar10", data_root=str(tmp_path)))
    assert not any(tmp_path.iterdir())  # nothing fetched
    assert "data_root" in error.value.message
    with pytest.raises(UsageError, match="not a known dataset"):
        data.build_datasets(TrainConfig(data="imagenet"))


def test_imagefolder_counts_classes(tmp_path: Path) -> None:
    from PIL import Image

    for cls in ("cat", "dog", "emu"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        Image.new("RGB", (20, 20)).save(tmp_path / "train" / cls / "a.png")
    train, held_out = data.build_datasets(
        TrainConfig(data="imagefolder", data_root=str(tmp_path), image_size=16, num_classes=3)
    )
    assert len(train) == 3 and held_out is None and train[0][0].shape == (3, 16, 16)
    with pytest.raises(UsageError, match="--num-classes 3"):
        data.build_datasets(TrainConfig(data="imagefolder", data_root=str(tmp_path), num_classes=2))


# -- entrypoint exit codes ---------------------------------------------------------------------
def test_bad_flags_exit_2_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and "hint" in err and "Traceback" not in err


def test_inconsistent_launch_exits_3_before_importing_torch() -> None:
    probe = "import sys\nfrom dist_jobs.train.__main__ import main\nrc = main([])\nprint(rc, 'torch' in sys.modules)"
    out = subprocess.run(
        [PYTHON, "-c", probe], capture_output=True, text=True, timeout=HUNG_S, cwd=REPO, env=child_env(WORLD_SIZE="4")
    )
    assert out.stdout.split() == ["3", "False"], out.stderr
    assert "WORLD_SIZE='4'" in out.stderr and "hint:" in out.stderr and "Traceback" not in out.stderr


# -- a vanished peer ---------------------------------------------------------------------------
GLOO_RESET = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [10.0.0.2]:21415: Connection reset by "
    "peer. This is typically caused by a remote worker hanging or bugs in the application."
)


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (RuntimeError(GLOO_RESET), True),  # a collective, as gloo reports a dead peer (seen with kill -9)
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer"), True),
        (dist.DistStoreError("Timed out after 61 seconds waiting for clients. 1/2 clients joined."), True),
        (dist.DistNetworkError("The client socket has failed to connect to [master]:23456"), True),
        (RuntimeError("DataLoader worker (pid 7) timed out"), False),  # not torch.distributed's
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),  # a bug
        (ValueError("Connection reset by gloo"), False),
    ],
)
def test_peer_lost_tells_a_vanished_peer_from_a_bug(error: BaseException, lost: bool) -> None:
    from dist_jobs.train.distributed import peer_lost

    assert peer_lost(error) is lost


@pytest.mark.slow
def test_a_lost_peer_in_rendezvous_exits_with_the_retryable_code(tmp_path: Path) -> None:
    """Rank 1 of 2 whose rank 0 never comes: the TCPStore times out, exit 200 (not 1)."""
    env = {
        **child_env(),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),  # nothing listens: the client fails to connect until the timeout
        "DIST_JOBS_ENV": "torchrun",
        "DIST_JOBS_BACKEND": "local",  # two "nodes" on this host, both on loopback
        "DIST_JOBS_RDZV_TIMEOUT": "3",
    }
    argv = [PYTHON, "-m", "dist_jobs.train", "--device", "cpu", "--fake-samples", "8", "--epochs", "1"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=HUNG_S, cwd=tmp_path)
    assert proc.returncode == 200, proc.stderr[-2000:]
    assert "rank 1 lost a peer (" in proc.stderr and "exiting with 200" in proc.stderr


def test_the_language_model_reports_next_character_accuracy() -> None:
    """What the demo shows rising: the share of next characters the GPT predicts."""
    from dist_jobs.train.batches import language_model_loss

    class Echo(torch.nn.Module):  # predicts each next token as the current one
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(tokens, 5).float() * 10

    tokens = torch.tensor([[1, 1, 2, 2]])
    target = torch.tensor([[1, 2, 2, 3]])
    _, metrics = language_model_loss(Echo(), (tokens, target))
    assert float(metrics["accuracy"]) == 0.5 and metrics["tokens"] == 4.0


def test_the_demo_trains_a_task_it_can_learn() -> None:
    from dist_jobs.cli.demo import COMMAND

    assert "train.data=text" in COMMAND and "train.model=gpt" in COMMAND and "train.data=fake" not in COMMAND


def test_a_run_on_the_fake_images_with_a_users_model_never_imports_torchvision(tmp_path: Path) -> None:
    """The trainer's fake images are torch alone: no rank pays torchvision's import, and a python
    without torchvision runs them (the submit preflight asks for torch only)."""
    probe = (
        "import sys; from dist_jobs.train.__main__ import main; code = main(sys.argv[1:]); "
        "sys.exit(3 if 'torchvision' in sys.modules else code)"
    )
    small = ["--fake-samples", "8", "--batch-size", "4", "--image-size", "8", "--epochs", "1"]
    flags = ["--device", "cpu", "--model", "support.workloads:tiny_net", *small]
    argv = [PYTHON, "-c", probe, *flags, "--checkpoint-dir", str(tmp_path / "ckpt")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=HUNG_S, cwd=tmp_path, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
