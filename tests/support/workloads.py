"""The models and data sets the test jobs' ranks train: `module:factory` targets for the
entrypoint (`support.workloads:tiny_net`; tests/ is on the children's PYTHONPATH).

Every rank of every test job imports this module, so it imports nothing but the standard library
at the top (no pytest, no test helpers): torch inside the factories, as the entrypoint has it by then.
Both tiny_net and tiny_data draw from the global RNG while training (dropout, a random flip in
__getitem__), so a resumed run is bit-identical only if every rank's RNG is restored.
"""

from __future__ import annotations

import os
import time
from typing import Any


def tiny_net(num_classes: int = 10) -> Any:
    """conv-BN-ReLU-dropout-linear: buffers, RNG use, and a few thousand parameters."""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.Dropout(0.2),
                nn.AdaptiveAvgPool2d(4),
                nn.Flatten(),
                nn.Linear(8 * 16, num_classes),
            )
            # Slows training (never the numbers) so a test can signal at a chosen step.
            self.delay = float(os.environ.get("DJ_TEST_STEP_DELAY", "0"))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.delay and self.training:
                time.sleep(self.delay)
            return self.body(x)

    return Tiny()


def plain_net(num_classes: int = 10) -> Any:
    """No BatchNorm, no dropout: the gradient of a batch is the mean of its halves' gradients."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, num_classes)
    )


def slow_gpt() -> Any:
    """The built-in GPT (2 blocks, width 32, 2 heads; run it with --seq-len 16), each training
    forward slowed by $DJ_TEST_STEP_DELAY so a test can signal at a chosen step."""
    from dist_jobs.train.lm import GPT

    class Slow(GPT):
        def forward(self, tokens: Any) -> Any:
            delay = float(os.environ.get("DJ_TEST_STEP_DELAY", "0"))
            if delay and self.training:
                time.sleep(delay)
            return super().forward(tokens)

    return Slow(layers=2, heads=2, width=32, context=16)


def tiny_data(train: bool, config: Any) -> Any:
    """Seeded random images; the training split flips half of them at random (global RNG)."""
    import torch
    from torch.utils.data import Dataset

    size = config.fake_samples if train else max(config.fake_samples // 4, 1)
    gen = torch.Generator().manual_seed(1234 + int(train))
    images = torch.randn(size, 3, config.image_size, config.image_size, generator=gen)
    labels = torch.randint(0, config.num_classes, (size,), generator=gen)

    class Images(Dataset):
        def __len__(self) -> int:
            return size

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            image = images[index]
            if train and torch.rand(()) < 0.5:
                image = image.flip(-1)
            return image, int(labels[index])

    return Images()
