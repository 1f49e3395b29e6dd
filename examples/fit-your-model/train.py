"""Your model, data and loss, trained by dist-jobs' fit(): DDP, checkpoints, resume, preemption."""

import logging
import os
import sys

import torch
from torch.utils.data import TensorDataset

from dist_jobs.errors import DistJobsError
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.loop import fit


def make_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def mse(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    x, y = batch
    error = model(x) - y
    return (error**2).mean(), {"mae": error.abs().mean()}  # metrics: averaged over samples and ranks


def main() -> int:
    # fit() logs on rank 0: each epoch, every checkpoint, a resume, a preemption.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    config = TrainConfig(epochs=3, batch_size=32, lr=0.05, optimizer="sgd", progress=False)
    try:
        torch.manual_seed(0)  # the same initial weights on every rank and every run
        metrics = fit(config, torch.nn.Linear(8, 1), make_data(512), make_data(128), loss=mse)
    except DistJobsError as exc:  # a preemption: exit 200 and the job is requeued and resumes
        print(exc, file=sys.stderr)
        return exc.exit_code
    if os.environ.get("RANK", "0") == "0":
        print(f"eval_loss {metrics['eval_loss']:.4f}, eval_mae {metrics['eval_mae']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
