"""Datasets and loaders, and the sampler that lets a resumed run start part-way into an epoch.

`data` is one of:
- `fake`: `fake_samples` random images of `image_size` (torchvision FakeData's, without
  torchvision), the same on every run (each image is generated from its index and `seed`), for
  demos, tests and benchmarks;
- `cifar10`, `mnist`: from `data_root`; nothing is downloaded unless `download` is set;
- `imagefolder`: `data_root/train` and `data_root/val` (or `data_root` alone, no evaluation);
- `module:factory`: called as `factory(train=True|False, config=config)`, returning a Dataset
  of (image tensor, class index) pairs; for train=False it may return None (no evaluation).

Determinism: the DataLoader gets its own generator, reseeded per epoch, so worker seeds depend
on (seed, epoch) only and loader creation never draws from the global RNG, which the
checkpoint restores. Random augmentations in the main process (workers=0) resume exactly;
with workers > 0 a worker's RNG is not checkpointed, so a run resumed mid-epoch draws
different augmentations for the rest of that epoch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from dist_jobs.errors import UsageError
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.models import is_factory, load_factory

_BUILTIN = ("fake", "text", "cifar10", "mnist", "imagefolder")
_CIFAR_NORM = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
_IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can begin an epoch after the first `skip` indices of this rank.

    The skipped samples are never loaded: only the index list is sliced. Because the
    epoch's permutation depends on (seed, epoch) and not on the world size, and rank r takes
    positions r, r+W, r+2W, ..., the first k batches of all ranks together are exactly the
    first k*batch*W samples of that permutation, whatever W is. That is what makes resuming
    with a different world size (by global sample count) see every sample of the epoch.
    """

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


class _Strided(Sampler[int]):
    """Evaluation: rank r takes r, r+W, ... with no padding, so every sample counts once."""

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def build_datasets(config: TrainConfig) -> tuple[Dataset, Dataset | None]:
    """(train, eval or None) as `config.data` asks."""
    if is_factory(config.data):
        factory = load_factory(config.data, "data")
        return factory(train=True, config=config), factory(train=False, config=config)
    if config.data not in _BUILTIN:
        raise UsageError(
            f"data: {config.data!r} is not a known dataset", hint=f"use one of {', '.join(_BUILTIN)}, or module:factory"
        )
    if config.data == "fake":
        return _fake(config)
    if config.data == "text":
        from dist_jobs.train.lm import text_datasets  # the language model's data: loaded when asked for

        return text_datasets(config)
    if config.data_root is None and not (config.download and config.data != "imagefolder"):
        fetch = "" if config.data == "imagefolder" else ", or --download to fetch it there"
        raise UsageError(
            f"data_root is not set, and data={config.data} reads from it",
            hint=f"pass --data-root /path/to/dataset{fetch}",
        )
    return {"cifar10": _cifar10, "mnist": _mnist, "imagefolder": _imagefolder}[config.data](config)


def train_loader(dataset: Dataset, config: TrainConfig, *, rank: int, world_size: int, pin_memory: bool) -> DataLoader:
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, seed=config.seed)
    # drop_last: every batch is full, so "batches done" converts exactly to samples seen.
    return DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=config.workers,
        pin_memory=pin_memory,
        generator=torch.Generator(),
    )


def eval_loader(dataset: Dataset, config: TrainConfig, *, rank: int, world_size: int, pin_memory: bool) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=_Strided(len(dataset), rank, world_size),  # type: ignore[arg-type]
        num_workers=config.workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(config.seed),
    )


def steps_per_epoch(loader: DataLoader, config: TrainConfig, world_size: int) -> int:
    """Optimizer steps in an epoch: whole batches per rank, in whole accumulation groups."""
    steps = len(loader) // config.grad_accum
    if steps == 0:
        per_rank = len(loader.sampler)  # type: ignore[arg-type]
        raise UsageError(
            f"data: each of {world_size} ranks gets {per_rank} samples per epoch, "
            f"not one step of batch_size {config.batch_size} x grad_accum "
            f"{config.grad_accum}",
            hint="lower batch_size or grad_accum, or use more data",
        )
    return steps


def start_epoch(loader: DataLoader, epoch: int, skip_batches: int = 0) -> None:
    """Point the loader at `epoch`, leaving out the first `skip_batches` batches of this rank."""
    sampler = loader.sampler
    assert isinstance(sampler, ResumableSampler)
    sampler.set_epoch(epoch, skip=skip_batches * (loader.batch_size or 1))
    assert loader.generator is not None
    loader.generator.manual_seed(sampler.seed * 1_000_003 + epoch)


def resume_batches(samples_in_epoch: int, config: TrainConfig, world_size: int, epoch_steps: int) -> int:
    """Micro-batches of each rank to skip for a run resumed `samples_in_epoch` into an epoch.

    Exact when the world size and batch size did not change; otherwise the largest whole
    number of this run's accumulation groups that the samples already seen cover.
    """
    batches = samples_in_epoch // (config.batch_size * world_size)
    batches -= batches % config.grad_accum  # resume on an optimizer-step boundary
    return min(batches, epoch_steps * config.grad_accum)


def _fake(config: TrainConfig) -> tuple[Dataset, Dataset]:
    shape = (3, config.image_size, config.image_size)
    # Disjoint offsets: image i is generated from seed offset + i, so train and eval differ.
    train = FakeImages(config.fake_samples, shape, config.num_classes, offset=config.seed)
    held_out = FakeImages(
        max(config.fake_samples // 4, 1), shape, config.num_classes, offset=config.seed + config.fake_samples
    )
    return train, held_out


class FakeImages(Dataset):
    """torchvision's FakeData through ToTensor, the same images and classes, in torch alone.

    Not torchvision's class: importing torchvision costs each rank about one and a half seconds of start-up
    (BENCHMARKS.md), and torchvision's FakeData calls torch.manual_seed() for every item, which
    resets the global and every CUDA generator (dropout masks would follow the data index).
    Image i comes from a generator of its own, seeded `offset + i`."""

    def __init__(self, size: int, shape: tuple[int, int, int], num_classes: int, *, offset: int) -> None:
        self.size, self.shape, self.num_classes, self.offset = size, shape, num_classes, offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.size:
            raise IndexError(f"FakeImages index {index} out of range (size {self.size})")
        gen = torch.Generator().manual_seed(index + self.offset)
        image = torch.randn(*self.shape, generator=gen)
        target = int(torch.randint(0, self.num_classes, size=(1,), generator=gen)[0])
        # What ToPILImage then ToTensor make of it: 8-bit pixels, scaled to [0, 1].
        return image.mul(255).byte().to(torch.get_default_dtype()).div(255), target


def _cifar10(config: TrainConfig) -> tuple[Dataset, Dataset]:
    # torchvision for its data sets alone: importing it costs a rank ~1.5 s (bench/bench_fake_data.py)
    from torchvision import datasets
    from torchvision import transforms as T

    size = [T.Resize(config.image_size)] if config.image_size != 32 else []
    tail = [*size, T.ToTensor(), T.Normalize(*_CIFAR_NORM)]
    augment = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
    root = _root(config)
    _check_classes(config, 10)
    return (
        _open(datasets.CIFAR10, config, root=root, train=True, transform=T.Compose(augment + tail)),
        _open(datasets.CIFAR10, config, root=root, train=False, transform=T.Compose(tail)),
    )


def _mnist(config: TrainConfig) -> tuple[Dataset, Dataset]:
    # torchvision for its data sets alone: importing it costs a rank ~1.5 s (bench/bench_fake_data.py)
    from torchvision import datasets
    from torchvision import transforms as T

    # Three channels, so torchvision's ImageNet-shaped models take MNIST as it is.
    size = [T.Resize(config.image_size)] if config.image_size != 28 else []
    tf = T.Compose([*size, T.Grayscale(3), T.ToTensor(), T.Normalize((0.1307,) * 3, (0.3081,) * 3)])
    root = _root(config)
    _check_classes(config, 10)
    return (
        _open(datasets.MNIST, config, root=root, train=True, transform=tf),
        _open(datasets.MNIST, config, root=root, train=False, transform=tf),
    )


def _imagefolder(config: TrainConfig) -> tuple[Dataset, Dataset | None]:
    # torchvision for its data sets alone: importing it costs a rank ~1.5 s (bench/bench_fake_data.py)
    from torchvision import datasets
    from torchvision import transforms as T

    root = Path(_root(config))
    if not root.is_dir():
        raise UsageError(
            f"data_root={str(root)!r} is not a folder",
            hint="point --data-root at a folder with one sub-folder per class (or with train/ and val/ inside)",
        )
    size = config.image_size
    norm = [T.ToTensor(), T.Normalize(*_IMAGENET_NORM)]
    train_tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *norm])
    eval_tf = T.Compose([T.Resize(math.ceil(size * 8 / 7)), T.CenterCrop(size), *norm])
    split = (root / "train").is_dir()
    train = datasets.ImageFolder(str(root / "train" if split else root), transform=train_tf)
    _check_classes(config, len(train.classes))
    val = root / "val"
    held_out = datasets.ImageFolder(str(val), transform=eval_tf) if split and val.is_dir() else None
    return train, held_out


def _root(config: TrainConfig) -> str:
    return str(Path(config.data_root).expanduser()) if config.data_root else "data"


def _open(cls: Any, config: TrainConfig, **kwargs: Any) -> Dataset:
    try:
        return cls(download=config.download, **kwargs)
    except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted. ..."
        raise UsageError(
            f"data={config.data}: cannot open it under data_root={kwargs['root']!r}: {exc}",
            hint="fix --data-root, or pass --download to fetch it there (needs network access from the job)",
        ) from exc


def _check_classes(config: TrainConfig, found: int) -> None:
    # Labels >= num_classes would fail later as an opaque index error (a device assert on GPU).
    if config.num_classes < found:
        raise UsageError(
            f"num_classes={config.num_classes}, but data={config.data} has {found} classes",
            hint=f"set --num-classes {found}",
        )
