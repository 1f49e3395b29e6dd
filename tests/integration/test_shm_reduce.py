"""The shared-memory gradient all-reduce (dist_jobs/train/shm_reduce.py), with real gloo processes.

Each child trains one small model twice from the same seed and data, once under DDP's own gloo
all-reduce and once through the shared arena, with tiny buckets so that a step spans several
of them (and both slot sets). It reports the parameters of both, as bytes.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from support.tiers import require_module
from support.train_support import child_env, free_port, run_all

require_module("torch")

CHILD = r"""
import base64, datetime, json, os, sys
from pathlib import Path
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from dist_jobs.train import shm_reduce

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
folder = Path(os.environ["SHM_FOLDER"].replace("RANK", str(rank)))

def train(shared):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 64), nn.ReLU(),
                          nn.Linear(64, 5))
    ddp = DDP(model, gradient_as_bucket_view=True, bucket_cap_mb=0.004)
    attached = shm_reduce.attach(ddp, rank, world, datetime.timedelta(seconds=60), folder) if shared else None
    dist.barrier()  # rank 0 removes the arena's file once attach's last collective is over: look after that
    left = sorted(p.name for p in folder.glob("dist-jobs-grads-*")) if folder.is_dir() else []
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(100 + rank)  # every rank its own batches
    for _ in range(4):
        x, y = torch.randn(16, 3, 8, 8, generator=data), torch.randint(0, 5, (16,), generator=data)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return attached, left, base64.b64encode(flat.numpy().tobytes()).decode()

gloo = train(False)
attached, left, shared = train(True)
print(json.dumps({"attached": attached, "left": left, "gloo": gloo[2], "shared": shared}))
dist.destroy_process_group()
"""


def run_ranks(tmp_path: Path, world: int, folder: str) -> list[dict[str, object]]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    base = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), SHM_FOLDER=folder)
    results = run_all(script, [{**base, "RANK": str(r)} for r in range(world)], timeout=180)
    for r, result in enumerate(results):
        assert result.returncode == 0, f"rank {r} failed:\n{result.stderr[-3000:]}"
    return [json.loads(result.stdout.strip().splitlines()[-1]) for result in results]


def parameters(encoded: object) -> list[float]:
    import array

    values = array.array("f")
    values.frombytes(base64.b64decode(str(encoded)))
    return list(values)


def test_two_ranks_get_gloos_bits_and_leave_no_file(tmp_path: Path) -> None:
    """With two ranks, (g0 / 2) + (g1 / 2) is exactly what gloo computes: same parameters, bit for bit."""
    reports = run_ranks(tmp_path, 2, "/dev/shm")
    for report in reports:
        assert report["attached"] is True
        assert report["left"] == []  # removed once every rank mapped it
        assert report["shared"] == report["gloo"]
    assert reports[0]["shared"] == reports[1]["shared"]
    assert not [p for p in Path("/dev/shm").glob("dist-jobs-grads-*") if time.time() - p.stat().st_mtime < 300]


def test_three_ranks_agree_to_the_bit_and_with_gloo_to_rounding(tmp_path: Path) -> None:
    reports = run_ranks(tmp_path, 3, "/dev/shm")
    assert all(r["attached"] is True for r in reports)
    assert len({r["shared"] for r in reports}) == 1  # every rank holds the same model
    shared, gloo = parameters(reports[0]["shared"]), parameters(reports[0]["gloo"])
    assert len(shared) == len(gloo)
    assert max(abs(a - b) for a, b in zip(shared, gloo)) < 1e-5


def test_ranks_that_see_different_memory_keep_gloo(tmp_path: Path) -> None:
    """Ranks on other hosts (here: each rank its own folder) cannot map rank 0's arena: every rank
    keeps gloo, trains as before, and rank 0's file is gone."""
    for r in range(2):
        (tmp_path / f"shm{r}").mkdir()
    reports = run_ranks(tmp_path, 2, str(tmp_path / "shmRANK"))
    for report in reports:
        assert report["attached"] is False
        assert report["shared"] == report["gloo"]
    assert list((tmp_path / "shm0").iterdir()) == [] and list((tmp_path / "shm1").iterdir()) == []


def test_a_folder_that_cannot_hold_the_arena_is_refused_cleanly(tmp_path: Path) -> None:
    from dist_jobs.train.shm_reduce import _create

    assert _create(tmp_path / "missing", 1024)[0] is None
    name, token, why = _create(tmp_path, 1 << 62)  # more than any filesystem holds
    assert name is None and token == b"" and "is more than half of its" in why
    assert list(tmp_path.iterdir()) == []
    name, token, why = _create(tmp_path, 4096)
    arena = tmp_path / name
    assert arena.stat().st_size == 4096 and arena.read_bytes()[:16] == token and why == ""


def test_the_bound_covers_every_bucket_ddp_makes() -> None:
    from torch import nn

    from dist_jobs.train.shm_reduce import slot_bytes

    model = nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 10))
    total = sum(p.numel() * 4 for p in model.parameters())
    assert slot_bytes(model, 25 * 1024 * 1024) >= total  # all of it fits under the cap: one bucket
    assert slot_bytes(model, 1024) == -(-(1024 + 1000 * 1000 * 4) // 64) * 64  # the cap plus the largest
    frozen = nn.Linear(10, 10)
    frozen.weight.requires_grad_(False)
    assert slot_bytes(frozen, 1 << 20) == 64  # the bias alone, 40 bytes, on a cache line


LOST_PEER = r"""
import datetime, json, os, sys
from pathlib import Path
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from dist_jobs.train import shm_reduce

timeout = datetime.timedelta(seconds=20)
dist.init_process_group("gloo", init_method="env://", timeout=timeout)
rank, folder = dist.get_rank(), Path(os.environ["SHM_FOLDER"])
ddp = DDP(nn.Linear(4, 4))
if rank == 1:  # joins the arena's group, then is lost before rank 0's file is unlinked
    dist.new_group(backend="gloo", timeout=timeout)
    os._exit(0)
try:
    shm_reduce.attach(ddp, rank, 2, timeout, folder)
    outcome = "attached"
except Exception as exc:
    outcome = type(exc).__name__
print(json.dumps({"outcome": outcome, "left": sorted(p.name for p in folder.iterdir())}))
os._exit(0)
"""


def test_a_peer_lost_before_the_unlink_leaves_no_arena(tmp_path: Path) -> None:
    script, folder = tmp_path / "lost.py", tmp_path / "shm"
    script.write_text(LOST_PEER)
    folder.mkdir()
    base = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", SHM_FOLDER=str(folder))
    results = run_all(script, [{**base, "RANK": str(r)} for r in range(2)], timeout=120)
    report = json.loads(results[0].stdout.strip().splitlines()[-1])
    assert report["outcome"] != "attached"  # the collective failed: the peer is gone
    assert report["left"] == [] and list(folder.iterdir()) == []
