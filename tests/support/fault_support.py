"""A rank SIGKILLed mid-run, once: the fault the goodput ledger's test injects (test code only).

`support.fault_support:dying_net` is support.workloads' tiny_net whose training forward, on rank
$DJ_TEST_KILL_RANK (default 1) at its $DJ_TEST_KILL_BATCH-th training batch, SIGKILLs its own
process, as the OOM killer would. It happens once per run: the first rank to get there creates
$DJ_TEST_KILL_MARKER, and the attempt restarted in place finds it and trains normally. Without
DJ_TEST_KILL_MARKER it is tiny_net.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from support.hang_support import faulty_net


def dying_net(num_classes: int = 10) -> Any:
    return faulty_net("DJ_TEST_KILL", 7, num_classes, lambda rank, batch: os.kill(os.getpid(), signal.SIGKILL))
