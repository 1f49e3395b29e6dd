"""A rank that stops stepping mid-run, once: the hang the watchdog tests inject (test code only).

`support.hang_support:stalling_net` is support.workloads' tiny_net whose training forward, on rank
$DJ_TEST_HANG_RANK (default 1) at its $DJ_TEST_HANG_STEP-th training batch, sleeps for an hour,
the way a rank stuck in a dead filesystem read or a deadlocked data loader does; its peers then
wait for it in DDP's gradient all_reduce. It happens once per run: the first rank to get there
creates $DJ_TEST_HANG_MARKER (a file in a shared folder), and a run that finds the marker (the
requeued attempt, resumed from the last checkpoint) trains normally. Without DJ_TEST_HANG_MARKER
it is tiny_net.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.workloads import tiny_net


def stalling_net(num_classes: int = 10) -> Any:
    return faulty_net("DJ_TEST_HANG", 6, num_classes, _stall)


def faulty_net(prefix: str, at_batch: int, num_classes: int, fault: Callable[[int, int], None]) -> Any:
    """tiny_net whose training forward, on rank ${prefix}_RANK (default 1) at its
    ${prefix}_STEP-th (or ${prefix}_BATCH-th) batch, calls `fault(rank, batch)` once per run: the
    first rank to get there creates ${prefix}_MARKER. Without the marker variable: tiny_net."""
    import torch
    from torch import nn

    inner = tiny_net(num_classes)
    marker = os.environ.get(f"{prefix}_MARKER", "")
    rank = int(os.environ.get("RANK", "0"))
    faulty_rank = int(os.environ.get(f"{prefix}_RANK", "1"))
    at = int(os.environ.get(f"{prefix}_STEP") or os.environ.get(f"{prefix}_BATCH") or at_batch)

    class Faulty(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.batches = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training and marker and rank == faulty_rank:
                self.batches += 1
                if self.batches == at and _first_to_stall(Path(marker)):
                    fault(rank, at)
            return self.inner(x)

    return Faulty()


def _stall(rank: int, batch: int) -> None:
    print(f"hang_support: rank {rank} stops stepping at batch {batch}", file=sys.stderr, flush=True)
    stop_stepping()


def stop_stepping() -> None:
    """The frame the watchdog's stack dump shows for the stalled rank."""
    time.sleep(3600)


def _first_to_stall(marker: Path) -> bool:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True
