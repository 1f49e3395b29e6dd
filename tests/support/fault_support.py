"""A rank SIGKILLed mid-run, once: the fault the goodput ledger's test injects (test code only).

`support.fault_support:dying_net` is train_support's tiny_net whose training forward, on rank
$DJ_TEST_KILL_RANK (default 1) at its $DJ_TEST_KILL_BATCH-th training batch, SIGKILLs its own
process, as the OOM killer would. It happens once per run: the first rank to get there creates
$DJ_TEST_KILL_MARKER, and the attempt restarted in place finds it and trains normally. Without
DJ_TEST_KILL_MARKER it is tiny_net.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from support.hang_support import _first_to_stall
from support.train_support import tiny_net


def dying_net(num_classes: int = 10) -> Any:
    import torch
    from torch import nn

    inner = tiny_net(num_classes)
    marker = os.environ.get("DJ_TEST_KILL_MARKER", "")
    rank = int(os.environ.get("RANK", "0"))
    kill_rank = int(os.environ.get("DJ_TEST_KILL_RANK", "1"))
    kill_at = int(os.environ.get("DJ_TEST_KILL_BATCH", "7"))

    class Dying(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.batches = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training and marker and rank == kill_rank:
                self.batches += 1
                if self.batches == kill_at and _first_to_stall(Path(marker)):
                    os.kill(os.getpid(), signal.SIGKILL)
            return self.inner(x)

    return Dying()
