"""The runtime side: the shared DDP training entrypoint (`python -m dist_jobs.train`).

    from dist_jobs.train import fit, TrainConfig

This package's __init__ stays light: the job spec imports `dist_jobs.spec.train` at render
time, so torch is imported only by the modules that train. `TrainConfig` is the spec's own
(no torch); `fit` and `Preempted` load the training loop, and torch, on first use.
"""

from __future__ import annotations

from typing import Any

from dist_jobs.errors import Preempted
from dist_jobs.spec.train import TrainConfig


def __getattr__(name: str) -> Any:
    """`fit` on first use (PEP 562): importing it imports torch."""
    if name == "fit":
        from dist_jobs.train.loop import fit  # on first use: it imports torch

        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Preempted", "TrainConfig", "fit"]
