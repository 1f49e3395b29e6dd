"""Training configuration: the `train:` section of a job spec and the entrypoint's flags.

Render side and runtime side share this one model, so it imports pydantic only. The job spec
turns it into argv (`to_argv`) for the default command; the entrypoint parses it back
(`from_argv`), so what the scheduler runs is readable in the rendered script.
"""

from __future__ import annotations

import argparse
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("resnet18", description="torchvision model name, or module:factory")
    num_classes: int = Field(10, ge=2)
    data: str = Field("fake", description="fake | cifar10 | mnist | imagefolder | module:factory")
    data_root: str | None = Field(None, description="local dataset root (no download unless asked)")
    download: bool = False
    image_size: int = Field(32, ge=8)
    fake_samples: int = Field(512, ge=1, description="FakeData size for the demo and tests")
    epochs: int = Field(2, ge=1)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    batch_size: int = Field(32, ge=1, description="per-process batch size")
    grad_accum: int = Field(1, ge=1)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0)
    scale_lr: bool = Field(False, description="scale lr by global batch / 256")
    momentum: float = Field(0.9, ge=0)
    weight_decay: float = Field(5e-4, ge=0)
    warmup_steps: int = Field(0, ge=0)
    scheduler: Literal["cosine", "constant", "step"] = "cosine"
    amp: Literal["none", "bf16", "fp16"] = "none"
    sync_bn: bool = False
    workers: int = Field(0, ge=0, description="DataLoader workers per process")
    seed: int = 0
    deterministic: bool = False
    eval_every_epoch: bool = True
    log_every: int = Field(10, ge=1)
    progress: bool = True
    tensorboard: bool = False
    procs_per_device: int = Field(1, ge=1, description="processes sharing one GPU")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="auto: cuda if available")
    checkpoint_dir: str | None = Field(None, description="default: $DIST_JOBS_CHECKPOINT_DIR")
    run_name: str | None = Field(None, description="default: $DIST_JOBS_RUN")
    checkpoint_every_steps: int | None = Field(None, ge=1)
    checkpoint_every_minutes: float | None = Field(None, gt=0)
    keep_checkpoints: int = Field(3, ge=2)
    async_checkpoint: bool = False
    preempt_signals: tuple[str, ...] = ("SIGUSR1", "SIGUSR2", "SIGTERM")
    resume: bool = True

    def to_argv(self) -> list[str]:
        """Flags for the fields that differ from their defaults, in declaration order."""
        argv: list[str] = []
        defaults = TrainConfig()
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value == getattr(defaults, name):
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + name.replace("_", "-"))
            elif isinstance(value, tuple):
                argv += [flag, ",".join(value)]
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> TrainConfig:
        parser = argparse.ArgumentParser(prog="python -m dist_jobs.train")
        for name, field in cls.model_fields.items():
            flag = "--" + name.replace("_", "-")
            if field.annotation is bool:
                parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction)
            else:
                parser.add_argument(flag, dest=name, help=field.description)
        parsed = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
        if "preempt_signals" in parsed:
            parsed["preempt_signals"] = tuple(s for s in parsed["preempt_signals"].split(",") if s)
        return cls.model_validate(parsed)
