"""Training configuration: the `train:` section of a job spec and the entrypoint's flags.

Render side and runtime side share this one struct, so it imports msgspec only. The job spec
turns it into argv (`to_argv`) for the default command; the entrypoint parses it back
(`from_argv`), so what the scheduler runs is readable in the rendered script.
"""

import argparse
from typing import Annotated, Literal

from msgspec import Meta, Struct, structs

from dist_jobs.errors import Problem, SpecError
from dist_jobs.spec.validate import END, Text, checked, convert, description, plain_type

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
Importable = Annotated[
    str,
    checked(
        rf"^{_DOTTED}(:{_DOTTED})?" + END,
        "is not a name or a module:factory reference",
        "write a name such as resnet18, or my_package.models:build",
    ),
]
# One folder inside the checkpoint directory: no '/', no '..', no leading '.' or '-'; NAME_MAX long.
RUN_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}"
RUN_NAME_RULE = (
    f"is not a run name: it must match {RUN_NAME} (ASCII letters, digits or '_' first, then also '.' "
    "and '-', at most 255 characters), so the run stays one folder inside the checkpoint directory"
)
RUN_NAME_FIX = "write it with those characters only (no space, '/' or accent), e.g. resnet50-lr0.1"
RunName = Annotated[
    str,
    checked(
        rf"^{RUN_NAME}" + END,
        RUN_NAME_RULE,
        RUN_NAME_FIX,
    ),
]
SignalName = Annotated[
    str, checked(r"^[A-Za-z0-9]+" + END, "is not a signal name", "one signal per item, e.g. SIGUSR1 or USR1")
]


class TrainConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    model: Annotated[
        Importable, Meta(description="torchvision model name, gpt (the built-in language model), or module:factory")
    ] = "resnet18"
    num_classes: Annotated[
        int,
        Meta(
            ge=2,
            description="classes the model predicts (its output size; a module:factory model gets it as num_classes "
            "when it takes that argument); at least the data set's, e.g. 10 for cifar10",
        ),
    ] = 10
    data: Annotated[Importable, Meta(description="fake | text | cifar10 | mnist | imagefolder | module:factory")] = (
        "fake"
    )
    data_root: Annotated[
        Text | None, Meta(description="local dataset root (no download unless asked); text: a UTF-8 file")
    ] = None
    download: Annotated[
        bool,
        Meta(
            description="cifar10, mnist: download the data set into data_root (default: ./data) when it is not there; "
            "needs network access from the job"
        ),
    ] = False
    image_size: Annotated[
        int,
        Meta(
            ge=8,
            description="side in pixels of the images the model sees: fake generates them that size, cifar10 and "
            "mnist are resized to it, imagefolder crops to it",
        ),
    ] = 32
    fake_samples: Annotated[int, Meta(ge=1, description="how many images data: fake has (the demo and tests)")] = 512
    epochs: Annotated[int, Meta(ge=1, description="passes over the training data (max_steps can end sooner)")] = 2
    max_steps: Annotated[
        Annotated[int, Meta(ge=1)] | None, Meta(description="stop after this many optimizer steps")
    ] = None
    batch_size: Annotated[int, Meta(ge=1, description="per-process batch size")] = 32
    grad_accum: Annotated[
        int,
        Meta(
            ge=1,
            description="batches per optimizer step: the gradients of this many batches are averaged before "
            "one step, and the ranks all-reduce once per step",
        ),
    ] = 1
    optimizer: Annotated[
        Literal["sgd", "adamw"], Meta(description="sgd (with momentum and weight_decay) or adamw (weight_decay)")
    ] = "sgd"
    lr: Annotated[float, Meta(gt=0, description="peak learning rate, reached after warmup_steps (see scale_lr)")] = 0.1
    scale_lr: Annotated[bool, Meta(description="scale lr by global batch / 256")] = False
    momentum: Annotated[float, Meta(ge=0, description="sgd: momentum (adamw ignores it)")] = 0.9
    weight_decay: Annotated[float, Meta(ge=0, description="weight decay of sgd or adamw")] = 5e-4
    warmup_steps: Annotated[
        int, Meta(ge=0, description="optimizer steps over which the learning rate rises linearly to lr")
    ] = 0
    scheduler: Annotated[
        Literal["cosine", "constant", "step"],
        Meta(
            description="learning rate after warmup: cosine decays to 0 at the last step, constant keeps lr, "
            "step divides it by 10 at 1/3 and again at 2/3 of the steps"
        ),
    ] = "cosine"
    amp: Annotated[
        Literal["none", "bf16", "fp16"],
        Meta(
            description="mixed precision: the forward pass in bfloat16 or float16 (fp16 scales the loss and needs a "
            "CUDA GPU; fsdp takes bf16 only)"
        ),
    ] = "none"
    sync_bn: Annotated[
        bool,
        Meta(
            description="BatchNorm statistics over all ranks (SyncBatchNorm); GPU runs of ddp only, a CPU run keeps "
            "per-rank BatchNorm with a warning"
        ),
    ] = False
    shm_allreduce: Annotated[
        bool,
        Meta(description="CPU ranks on one host all-reduce gradients through /dev/shm, not loopback TCP (opt-in)"),
    ] = False
    workers: Annotated[int, Meta(ge=0, description="DataLoader workers per process")] = 0
    seed: Annotated[
        int, Meta(description="seeds the model's initialisation (the same on every rank), data order and fake data")
    ] = 0
    deterministic: Annotated[
        bool,
        Meta(
            description="deterministic torch algorithms and no cuDNN autotuning, so a resumed run ends with the "
            "bits an uninterrupted one would (slower)"
        ),
    ] = False
    eval_every_epoch: Annotated[
        bool, Meta(description="evaluate on the held-out split after each epoch (when the data has one)")
    ] = True
    log_every: Annotated[
        int,
        Meta(ge=1, description="optimizer steps between rank 0's log lines of loss, metrics and learning rate"),
    ] = 10
    progress: Annotated[
        bool,
        Meta(description="a progress bar on rank 0 when its stderr is a terminal (never in a job log)"),
    ] = True
    tensorboard: Annotated[
        bool,
        Meta(
            description="rank 0 writes TensorBoard scalars to tensorboard/ in the run folder (needs the "
            "tensorboard package)"
        ),
    ] = False
    grad_clip: Annotated[
        Annotated[float, Meta(gt=0)] | None, Meta(description="clip the gradient norm to this (after unscaling)")
    ] = None
    compile: Annotated[bool, Meta(description="torch.compile the model (opt-in: compiling takes a while)")] = False
    gpt_layers: Annotated[int, Meta(ge=1, description="gpt: transformer blocks")] = 4
    gpt_heads: Annotated[int, Meta(ge=1, description="gpt: attention heads per block")] = 4
    gpt_width: Annotated[int, Meta(ge=8, description="gpt: embedding width (a multiple of gpt_heads)")] = 128
    seq_len: Annotated[int, Meta(ge=2, description="gpt: tokens per sample (the context length)")] = 128
    text_chars: Annotated[int, Meta(ge=1000, description="text: size of the generated corpus")] = 200_000
    procs_per_device: Annotated[int, Meta(ge=1, description="processes sharing one GPU")] = 1
    device: Annotated[Literal["auto", "cuda", "cpu"], Meta(description="auto: cuda if available")] = "auto"
    checkpoint_dir: Annotated[Text | None, Meta(description="default: $DIST_JOBS_CHECKPOINT_DIR")] = None
    run_name: Annotated[RunName | None, Meta(description="default: $DIST_JOBS_RUN")] = None
    checkpoint_every_steps: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="also checkpoint every this many optimizer steps (a run always checkpoints at its end and "
            "when preempted)"
        ),
    ] = None
    checkpoint_every_minutes: Annotated[
        Annotated[float, Meta(gt=0)] | None,
        Meta(description="also checkpoint when this many minutes have passed since the last checkpoint"),
    ] = None
    keep_checkpoints: Annotated[
        int, Meta(ge=2, description="complete checkpoints kept in the run folder; older ones are deleted")
    ] = 3
    async_checkpoint: Annotated[
        bool,
        Meta(
            description="write checkpoints on a background thread: training waits only while the state is "
            "copied to CPU memory"
        ),
    ] = False
    preempt_signals: Annotated[
        tuple[SignalName, ...],
        Meta(
            description="signals that make the ranks checkpoint at the next step and exit with 200 to be requeued; "
            "names (SIGUSR1 or USR1) or numbers"
        ),
    ] = ("SIGUSR1", "SIGUSR2", "SIGTERM")
    resume: Annotated[
        bool,
        Meta(
            description="continue from the run folder's newest complete checkpoint; false starts over and refuses "
            "a run folder that already holds checkpoints"
        ),
    ] = True
    hang_watchdog: Annotated[
        bool, Meta(description="exit with the requeue code (after dumping stacks) when no optimizer step completes")
    ] = True
    hang_factor: Annotated[
        float, Meta(ge=1, description="hang: no step for max(this x median step time, hang_min_seconds)")
    ] = 20.0
    hang_min_seconds: Annotated[float, Meta(gt=0, description="hang: never sooner than this")] = 300.0
    strategy: Annotated[
        Literal["ddp", "fsdp"],
        Meta(
            description="ddp: every rank holds the whole model; fsdp: parameters, gradients and optimizer state sharded"
        ),
    ] = "ddp"
    fsdp_policy: Annotated[
        tuple[Importable, ...],
        Meta(
            description="fsdp: what to shard as one unit: module classes (module:Class, comma-separated) "
            "or one module:function(model) returning the submodules (default: gpt blocks, ResNet stages)"
        ),
    ] = ()
    fsdp_cpu_offload: Annotated[
        bool, Meta(description="fsdp: keep parameters, gradients and optimizer state in CPU memory (CUDA runs)")
    ] = False
    activation_checkpointing: Annotated[
        bool, Meta(description="fsdp: recompute each block's activations in the backward pass")
    ] = False
    collective_timeout: Annotated[
        Annotated[float, Meta(gt=0)] | None,
        Meta(
            description="seconds a collective may wait for its peers "
            "(default: $DIST_JOBS_COLLECTIVE_TIMEOUT, which the job templates set to 2 x hang_min_seconds)"
        ),
    ] = None

    def to_argv(self) -> list[str]:
        """Flags for the fields that differ from their defaults, in declaration order. A value
        rides in its flag's word (`--data-root=-x`): argparse would take a separate word that
        starts with '-' for a flag of its own and stop the job at start."""
        argv: list[str] = []
        defaults = TrainConfig()
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value == getattr(defaults, name):
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + name.replace("_", "-"))
            elif isinstance(value, tuple):
                argv.append(f"{flag}={','.join(value)}")
            elif value is not None:
                argv.append(f"{flag}={value}")
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> "TrainConfig":
        parser = argparse.ArgumentParser(prog="python -m dist_jobs.train")
        for field in structs.fields(cls):
            name = field.name
            flag = "--" + name.replace("_", "-")
            switch = plain_type(field.type) is bool
            action: str | type[argparse.Action] = argparse.BooleanOptionalAction if switch else "store"
            parser.add_argument(flag, dest=name, action=action, help=description(field.type))
        # `--flag=value` (what to_argv writes) is read here, not by argparse, which drops a value
        # of `--` (its end-of-options marker) and would hand the field an empty list.
        valued = {
            "--" + f.name.replace("_", "-"): f.name for f in structs.fields(cls) if plain_type(f.type) is not bool
        }
        explicit: dict[str, str] = {}
        rest = []
        for arg in argv:
            flag, sep, value = arg.partition("=")
            if sep and flag in valued:
                explicit[valued[flag]] = value
            else:
                rest.append(arg)
        parsed = {k: v for k, v in vars(parser.parse_args(rest)).items() if v is not None}
        parsed.update(explicit)
        for listed in ("preempt_signals", "fsdp_policy"):
            if listed in parsed:
                parsed[listed] = tuple(s for s in parsed[listed].split(",") if s)
        config = convert(cls, parsed, "training flags")
        problems = hang_problems(config, flags=True) + strategy_problems(config, flags=True)
        if problems:
            raise SpecError(problems, "training flags")
        return config


def hang_problems(train: TrainConfig, flags: bool = False) -> list[Problem]:
    """The watchdog must fire before a collective times out: the timeout aborts the process
    (NCCL: exit 134) with no stack dump and no requeue. A floor close below the timeout is
    clamped at run time (with a warning); one at or above it is refused here. `flags`: name the
    trainer's flags instead of the spec's fields."""
    timeout = train.collective_timeout
    if not train.hang_watchdog or timeout is None or train.hang_min_seconds < timeout:
        return []
    floor, other = (
        ("--hang-min-seconds", "--collective-timeout")
        if flags
        else ("train.hang_min_seconds", "train.collective_timeout")
    )
    return [
        Problem(
            "hang_min_seconds" if flags else floor,  # the entrypoint turns a field into its flag
            train.hang_min_seconds,
            f"is not below {other} ({timeout:g} s, the job's DIST_JOBS_COLLECTIVE_TIMEOUT): "
            "a hung collective would abort the process (not requeued, no stack dump) before the watchdog fires",
            f"lower {floor}, or raise {other} to at least {2 * train.hang_min_seconds:g} "
            "(unset, it is twice the hang floor)",
        )
    ]


def strategy_problems(train: TrainConfig, flags: bool = False) -> list[Problem]:
    """The combinations of train.strategy the trainer refuses, each with its fix."""
    name = (lambda f: f) if flags else (lambda f: "train." + f)  # the entrypoint turns a field into its flag
    strategy = "--strategy" if flags else "train.strategy"
    if train.strategy == "ddp":
        only_fsdp = [f for f in ("fsdp_policy", "fsdp_cpu_offload", "activation_checkpointing") if getattr(train, f)]
        return [
            Problem(name(f), getattr(train, f), "only applies with strategy fsdp", f"set {strategy} fsdp, or drop it")
            for f in only_fsdp
        ]
    refused = {
        "compile": (True, "is not supported with strategy fsdp here", f"drop it, or use {strategy} ddp"),
        "amp": ("fp16", "fp16 needs a GradScaler across shards, which fsdp does not do here", "use bf16"),
        "sync_bn": (True, "SyncBatchNorm is not supported with strategy fsdp", f"drop it, or use {strategy} ddp"),
    }
    return [
        Problem(name(field), value, message, fix)
        for field, (value, message, fix) in refused.items()
        if getattr(train, field) == value
    ]


# The built-in data sets that come from torchvision (`text` and `fake` are the trainer's own).
TORCHVISION_DATA = ("cifar10", "mnist", "imagefolder")


def trainer_packages(config: TrainConfig) -> tuple[str, ...]:
    """What the built-in trainer imports for `config`: torch, and torchvision for one of its
    classification models (a bare name other than gpt) or one of its data sets."""
    vision_model = ":" not in config.model and config.model != "gpt"
    return ("torch", "torchvision") if vision_model or config.data in TORCHVISION_DATA else ("torch",)
