"""A bad part on one rank makes every rank resume from the same older checkpoint (4 processes, gloo).

Each rank verifies only the files it loads, so the others cannot see that rank 2's file of the
newest checkpoint is damaged; the all_reduce that resume() passes to latest() tells them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.tiers import requires
from support.train_support import PYTHON, start_ranks, wait_all

pytestmark = [requires("torch"), pytest.mark.timeout(240)]

WORLD, BAD_RANK = 4, 2

RANK_SCRIPT = """
import json, logging, os, sys
from functools import partial
from pathlib import Path
import torch
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.distributed import max_over_ranks, session

folder, bad = Path(sys.argv[1]), int(sys.argv[2])
logging.basicConfig(level=logging.WARNING, format="%(message)s")
with session(TrainConfig(device="cpu")) as d:
    ck = Checkpointer(folder, rank=d.rank, world_size=d.world_size)
    d.barrier()  # rank 0's constructor clears stale partial folders before anyone writes
    for step in (1, 2, 3):
        shared = {"w": torch.full((1000,), float(step))} if d.rank == 0 else None
        ck.save(step, shared, {"rank": d.rank, "step": step})
    d.barrier()  # rank 0 passes it once step 3 is committed
    if d.rank == 0:
        path = folder / "step-3" / f"rank-{bad}.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    d.barrier()
    resumed = Checkpointer(folder, rank=d.rank, world_size=d.world_size)
    loaded = resumed.latest(partial(max_over_ranks, group=d.control))  # what resume() passes
    alone = Checkpointer(folder, rank=d.rank, world_size=d.world_size).latest()
    print("RESULT " + json.dumps({"rank": d.rank, "step": loaded.step, "mine": loaded.rank_state,
                                  "w": float(loaded.shared["w"][0]), "alone": alone.step}), flush=True)
"""


def test_one_rank_damaged_part_makes_all_ranks_fall_back_together(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    folder = tmp_path / "checkpoints"
    launches = start_ranks([str(folder), str(BAD_RANK)], tmp_path, world=WORLD, command=[PYTHON, str(script)])
    codes = wait_all(launches, timeout=200)
    logs = [launch.text() for launch in launches]
    assert codes == [0] * WORLD, "\n".join(log[-2000:] for log in logs)
    results = [json.loads(log.split("RESULT ", 1)[1].splitlines()[0]) for log in logs]
    assert [(r["rank"], r["step"], r["w"]) for r in results] == [(rank, 2, 2.0) for rank in range(WORLD)]
    assert [r["mine"] for r in results] == [{"rank": rank, "step": 2} for rank in range(WORLD)]
    # Alone, a rank sees only its own part: without the all_reduce the ranks would disagree.
    assert [r["alone"] for r in results] == [2 if rank == BAD_RANK else 3 for rank in range(WORLD)]
    assert f"rank-{BAD_RANK}.pt is damaged" in logs[BAD_RANK]
    assert "step-3 is not usable on every rank" in logs[0]
