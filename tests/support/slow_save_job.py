"""A user's fit() whose checkpoints take longer than the hang watchdog's limit (test code only).

    python slow_save_job.py [training flags...]      (one process per rank, env://)

$DJ_TEST_SLOW_STATE_S: the `state=` object's state_dict() takes that long (fit() calls it on rank
0 at every save), as a user's state that gathers itself from elsewhere does. $DJ_TEST_SLOW_WRITE_S:
every torch.save into the checkpoint takes that much longer, as on slow shared storage (with
--async-checkpoint the writer thread pays it, and the waits for it do: the next save's, the
last one's). Neither is a hang: the run must finish with exit 0 and no stack dump.
$DJ_TEST_SLOW_RANK: only that rank's writes are slow; $DJ_TEST_SAVE_MARKER: a file the first slow
write puts this process's pid in before it waits, so a test can stop the rank inside its save.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import torch

from support.regression_job import Points, Regressor, mse


class SlowState:
    """A user object fit() checkpoints; producing its state takes a while."""

    def __init__(self) -> None:
        self.saves = 0

    def state_dict(self) -> dict[str, Any]:
        time.sleep(float(os.environ.get("DJ_TEST_SLOW_STATE_S", "0")))
        self.saves += 1
        return {"saves": self.saves}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saves = state["saves"]


def slow_storage(delay: float) -> None:
    save = torch.save
    only = os.environ.get("DJ_TEST_SLOW_RANK", "")
    if not delay or (only and only != os.environ.get("RANK")):
        return
    marker = os.environ.get("DJ_TEST_SAVE_MARKER", "")

    def slow_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if marker and not os.path.exists(marker):
            with open(marker + ".new", "w") as fh:
                fh.write(str(os.getpid()))
            os.rename(marker + ".new", marker)
        time.sleep(delay)
        save(obj, f, *args, **kwargs)

    torch.save = slow_save  # type: ignore[assignment]


def main() -> int:
    from dist_jobs.errors import DistJobsError
    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.loop import fit

    config = TrainConfig.from_argv(sys.argv[1:])
    logging.basicConfig(level=logging.INFO if os.environ.get("RANK") == "0" else logging.WARNING)
    slow_storage(float(os.environ.get("DJ_TEST_SLOW_WRITE_S", "0")))
    torch.manual_seed(0)
    try:
        metrics = fit(config, Regressor(), Points(96), None, loss=mse, state={"slow": SlowState()})
    except DistJobsError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"finished at step {metrics['step']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
