"""A user's own workload on fit(): regression on dict batches, a custom loss with its own metrics,
and a stateful object (an exponential moving average of the weights) that fit() checkpoints.

    python regression_job.py OUT_DIR [training flags...]      (one process per rank, env://)

Each rank saves its final metrics, model and EMA to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset


class Points(Dataset):
    """y = x . w + noise, as {"x": [8], "y": []} samples; noise drawn per access (RNG-dependent)."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = self.x @ torch.arange(1.0, 9.0) / 8

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i] + 0.01 * torch.randn(())}


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        delay = float(os.environ.get("DJ_TEST_STEP_DELAY", "0"))
        if delay and self.training:
            time.sleep(delay)  # wall time only: lets a test aim a signal mid-epoch
        return self.net(x).squeeze(-1)


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    error = model(batch["x"]) - batch["y"]
    # `rank` averages to the mean rank over all samples: proof that metrics are all_reduced.
    return (error**2).mean(), {"mae": error.abs().mean(), "rank": float(os.environ.get("RANK", "0"))}


class EMA:
    """A user object with state_dict()/load_state_dict(): fit() checkpoints it."""

    def __init__(self, model: nn.Module, decay: float = 0.9) -> None:
        self.model, self.decay = model, decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.updates = 0

    def update(self) -> None:
        for k, v in self.model.state_dict().items():
            self.shadow[k].mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow, self.updates = state["shadow"], state["updates"]


def main() -> int:
    from dist_jobs.errors import DistJobsError
    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.loop import fit

    out, config = sys.argv[1], TrainConfig.from_argv(sys.argv[2:])
    logging.basicConfig(level=logging.INFO if os.environ.get("RANK") == "0" else logging.WARNING)
    torch.manual_seed(0)
    model = Regressor()
    ema = EMA(model)

    def loss(m: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        if m.training:
            ema.update()  # once per micro-batch: its count must come back exactly on resume
        return mse(m, batch)

    try:
        metrics = fit(config, model, Points(96), Points(32), loss=loss, state={"ema": ema})
    except DistJobsError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    torch.save(
        {"metrics": metrics, "model": model.state_dict(), "ema": ema.state_dict()},
        os.path.join(out, f"rank{os.environ['RANK']}.pt"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
