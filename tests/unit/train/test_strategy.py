"""train.strategy: the combinations refused (exit 2, naming field, value and fix), the flags, the
blocks fsdp shards one by one, and the export verb's input checks (no torch in the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dist_jobs.errors import SpecError, UsageError
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.train import TrainConfig
from support.paths import REPO
from support.tiers import requires
from support.waiting import HUNG_S

pytestmark = requires("torch")

BASE = {"name": "t", "nodes": 1, "procs_per_node": 2, "image": "reg.example/t:1"}


@pytest.mark.parametrize(
    ("train", "field", "fix"),
    [
        ({"strategy": "fsdp", "compile": True}, "train.compile", "use train.strategy ddp"),
        ({"strategy": "fsdp", "amp": "fp16"}, "train.amp", "use bf16"),
        ({"strategy": "fsdp", "sync_bn": True}, "train.sync_bn", "use train.strategy ddp"),
        ({"fsdp_cpu_offload": True}, "train.fsdp_cpu_offload", "set train.strategy fsdp"),
        ({"activation_checkpointing": True}, "train.activation_checkpointing", "set train.strategy fsdp"),
        ({"fsdp_policy": ["m:Block"]}, "train.fsdp_policy", "set train.strategy fsdp"),
    ],
)
def test_the_spec_refuses_what_fsdp_or_ddp_cannot_do(train: dict, field: str, fix: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(data={**BASE, "train": train})
    text = str(refused.value)
    assert field in text and fix in text, text


def test_the_spec_accepts_fsdp_with_its_options() -> None:
    spec = load_spec(
        data={
            **BASE,
            "train": {"strategy": "fsdp", "amp": "bf16", "activation_checkpointing": True, "fsdp_policy": ["m:B"]},
        }
    )
    assert spec.train.strategy == "fsdp" and spec.train.fsdp_policy == ("m:B",)


def test_the_trainer_flags_refuse_with_exit_2_naming_the_flag_value_and_fix() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dist_jobs.train", "--strategy", "fsdp", "--amp", "fp16"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HUNG_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--amp" in proc.stderr and "'fp16'" in proc.stderr and "use bf16" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_strategy_flags_round_trip_through_argv() -> None:
    config = TrainConfig(strategy="fsdp", fsdp_policy=("a.b:Block", "a.b:Other"), activation_checkpointing=True)
    argv = config.to_argv()
    assert "--strategy=fsdp" in argv and "--fsdp-policy=a.b:Block,a.b:Other" in argv
    assert TrainConfig.from_argv(argv) == config
    assert TrainConfig.from_argv([]).strategy == "ddp"


def block_list(model: object) -> list:
    return [model.blocks[0]]  # type: ignore[attr-defined]


def test_fsdp_units_are_gpt_blocks_resnet_stages_or_the_policy() -> None:
    import torch
    from torch import nn

    from dist_jobs.train import fsdp, models
    from dist_jobs.train.lm import _Block

    config = TrainConfig(model="gpt", gpt_layers=3, strategy="fsdp")
    gpt = fsdp.build(config)
    assert all(p.is_meta for p in gpt.parameters())  # nothing allocated before sharding
    assert fsdp.blocks(gpt, config) == list(gpt.blocks)  # type: ignore[attr-defined]
    with torch.device("meta"):
        resnet = models.build_model("resnet18", 10)
    assert fsdp.blocks(resnet, config) == [resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4]
    assert fsdp.blocks(nn.Linear(2, 2), config) == []
    by_class = TrainConfig(strategy="fsdp", fsdp_policy=("dist_jobs.train.lm:_Block",))
    assert fsdp.blocks(gpt, by_class) == [m for m in gpt.modules() if isinstance(m, _Block)]
    by_function = TrainConfig(strategy="fsdp", fsdp_policy=(f"{__name__}:block_list",))
    assert fsdp.blocks(gpt, by_function) == [gpt.blocks[0]]  # type: ignore[index]
    with pytest.raises(UsageError, match="selects no submodule"):
        fsdp.blocks(nn.Linear(2, 2), by_class)
    mixed = TrainConfig(strategy="fsdp", fsdp_policy=(f"{__name__}:block_list", "dist_jobs.train.lm:_Block"))
    with pytest.raises(UsageError, match="mixes functions and classes"):
        fsdp.blocks(gpt, mixed)


def test_fsdp_cpu_offload_on_a_cpu_run_is_refused_with_the_fix() -> None:
    import torch

    from dist_jobs.train import fsdp

    config = TrainConfig(model="gpt", strategy="fsdp", fsdp_cpu_offload=True)
    with pytest.raises(UsageError, match="needs a CUDA device") as refused:
        fsdp.shard(fsdp.build(config), config, torch.device("cpu"), warn=False)
    assert "drop --fsdp-cpu-offload" in str(refused.value.hint)


def test_export_refuses_safetensors_without_the_package_and_unknown_suffixes(tmp_path: Path) -> None:
    import importlib.util

    from dist_jobs.train.checkpoint.export import export

    with pytest.raises(UsageError, match="unknown format"):
        export(tmp_path, tmp_path / "model.bin")
    if importlib.util.find_spec("safetensors") is None:
        with pytest.raises(UsageError, match="needs the 'safetensors' package"):
            export(tmp_path, tmp_path / "model.safetensors")
    with pytest.raises(UsageError, match="holds no committed checkpoint"):
        export(tmp_path, tmp_path / "model.pt")


def test_the_export_verb_exits_2_on_bad_input_and_the_cli_never_imports_torch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dist_jobs", "export", str(tmp_path), "-o", str(tmp_path / "m.pt"), "--step", "3"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HUNG_S,
    )
    assert proc.returncode == 2 and "dist-jobs export" in proc.stderr and "Traceback" not in proc.stderr
    lean = "import sys, dist_jobs.cli, dist_jobs.cli.commands, dist_jobs.cli.parser; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", lean], capture_output=True, text=True, cwd=REPO).stdout == "False\n"
