"""Checkpoint layer: layout, commit order, pruning, RNG, weights_only safety, async, multi-rank."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from support.paths import REPO
from support.tiers import require_module
from support.waiting import HUNG_S, eventually

torch = require_module("torch")
np = require_module("numpy")

from dist_jobs.constants import VERSION  # noqa: E402
from dist_jobs.rundir.lock import LockLost  # noqa: E402
from dist_jobs.train.checkpoint import write as disk  # noqa: E402
from dist_jobs.train.checkpoint.checkpointer import Checkpointer, CheckpointError, Loaded  # noqa: E402
from dist_jobs.train.rng import rng_state, set_rng_state  # noqa: E402


def _shared(step: int, size: int = 1000) -> dict:
    return {
        "model": {"w": torch.full((size,), float(step)), "b": torch.arange(3)},
        "step": step,
        "config": {"lr": 0.1, "name": "x"},
        "position": (step, None),
    }


def _run_ranks(world: int, body: Callable[[int], None], timeout: float = 60.0) -> None:
    """Run body(rank) on one thread per rank; re-raise the first failure."""
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            body(rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank thread hung"
    if errors:
        raise errors[0]


def _names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_layout_marker_and_pointer(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    ck.save(7, _shared(7), {"mine": torch.tensor([1.0])})
    ck.wait()  # `latest` moves after the commit, on the pruner thread
    assert _names(tmp_path) == ["latest", "step-7"]
    assert (tmp_path / "latest").read_text().strip() == "step-7"
    folder = tmp_path / "step-7"
    assert _names(folder) == ["COMPLETE", "rank-0.pt", "shared.pt"]  # no temporary file left
    # A JSON line, then one fixed-width record per rank: a rank reads only its own.
    head, record, end = (folder / "COMPLETE").read_bytes().split(b"\n")
    marker = json.loads(head)
    assert marker["step"] == 7 and marker["world_size"] == 1 and marker["version"] == VERSION
    assert marker["files"]["shared.pt"] == disk.digest(folder / "shared.pt")
    digest = disk.digest(folder / "rank-0.pt")
    assert record.split() == [b"rank-0.pt", str(digest["size"]).encode(), digest["crc32"].encode()]
    assert len(record) + 1 == marker["rank_record_bytes"] and end == b""
    loaded = ck.latest()
    assert isinstance(loaded, Loaded) and loaded.step == 7 and loaded.path == folder
    assert loaded.world_size == 1
    assert torch.equal(loaded.shared["model"]["w"], torch.full((1000,), 7.0))
    assert loaded.shared["position"] == (7, None) and loaded.shared["config"]["name"] == "x"
    assert torch.equal(loaded.rank_state["mine"], torch.tensor([1.0]))


def test_commit_order_complete_last_then_pointer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, bool]] = []
    real = disk.write_atomic

    def spy(final: Path, write: Callable) -> dict:
        events.append((final.name, (tmp_path / "step-3").exists()))
        return real(final, write)

    monkeypatch.setattr(disk, "write_atomic", spy)
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    ck.save(3, _shared(3), {})
    ck.wait()
    # COMPLETE is the last file inside the folder, written before the folder becomes step-3;
    # the pointer is replaced only once step-3 exists.
    assert events == [("shared.pt", False), ("rank-0.pt", False), ("COMPLETE", False), ("latest", True)]


def test_latest_is_none_without_checkpoints(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "new", rank=0, world_size=1).latest() is None
    (tmp_path / "new" / "step-5").mkdir()  # a step folder without COMPLETE does not count
    assert Checkpointer(tmp_path / "new", rank=1, world_size=2).latest() is None


def test_keep_prunes_older_checkpoints(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1, keep=2)
    for step in (10, 20, 30, 40):
        ck.save(step, _shared(step), {})
    ck.wait()  # pruning runs on a thread of its own
    assert _names(tmp_path) == ["latest", "step-30", "step-40"]
    ck3 = Checkpointer(tmp_path, rank=0, world_size=1, keep=3)
    ck3.save(50, _shared(50), {})
    ck3.save(60, _shared(60), {})
    ck3.close()
    assert _names(tmp_path) == ["latest", "step-40", "step-50", "step-60"]


def test_pruning_does_not_hold_up_the_saving_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save() returns once its step counts, while the removal of older checkpoints still runs;
    wait() (and the next save) finish it, and a lost lock found by the pruner is raised there."""
    ck = Checkpointer(tmp_path, rank=0, world_size=1, keep=2)
    for step in (1, 2):
        ck.save(step, _shared(step), {})
    ck.wait()
    removing, release = threading.Event(), threading.Event()
    remove = disk.remove

    def held(folder: Path) -> None:
        removing.set()
        assert release.wait(30), "the test never released the pruner"
        remove(folder)

    monkeypatch.setattr(disk, "remove", held)
    ck.save(3, _shared(3), {})  # returns although the pruner is stuck in remove()
    assert removing.wait(30) and ck.latest().step == 3
    assert _names(tmp_path) == ["latest", "step-1", "step-2", "step-3"]
    release.set()
    ck.wait()
    assert _names(tmp_path) == ["latest", "step-2", "step-3"]


def test_a_pruner_that_lost_the_lock_removes_nothing_and_the_next_wait_says_so(tmp_path: Path) -> None:
    lost = threading.Event()

    def fence(doing: str) -> None:
        if lost.is_set() and "prune" in doing:
            raise LockLost(tmp_path, None, doing)

    ck = Checkpointer(tmp_path, rank=0, world_size=1, keep=2, fence=fence)
    for step in (1, 2):
        ck.save(step, _shared(step), {})
    lost.set()
    ck.save(3, _shared(3), {})
    with pytest.raises(LockLost, match="not going to point latest at step-3 and prune older checkpoints"):
        ck.wait()
    assert _names(tmp_path) == ["latest", "step-1", "step-2", "step-3"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rank": 0, "world_size": 1, "keep": 1}, "keep=1"),
        ({"rank": 2, "world_size": 2}, "rank 2"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle) as info:
        Checkpointer(tmp_path, **kwargs)
    assert info.value.hint


def test_rank0_must_pass_shared_and_step_must_be_int(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    with pytest.raises(CheckpointError, match="shared state"):
        ck.save(1, None, {})
    with pytest.raises(CheckpointError, match="step"):
        ck.save(-1, _shared(1), {})
    assert _names(tmp_path) == []


def test_same_step_twice_keeps_the_committed_one(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    ck.save(5, _shared(5), {"v": 1})
    inode = (tmp_path / "step-5" / "shared.pt").stat().st_ino
    ck.save(5, _shared(99), {"v": 2})
    loaded = ck.latest()
    assert loaded.step == 5 and loaded.rank_state == {"v": 1}
    assert torch.equal(loaded.shared["model"]["w"], torch.full((1000,), 5.0))
    assert (tmp_path / "step-5" / "shared.pt").stat().st_ino == inode
    assert _names(tmp_path) == ["latest", "step-5"]


@pytest.mark.parametrize("bad", [np.zeros(3), np.float64(1.5), object(), {"k": {1.5j: [Path("x")]}}])
def test_state_that_weights_only_cannot_load_is_refused(tmp_path: Path, bad: object) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    with pytest.raises(CheckpointError, match="weights_only") as info:
        ck.save(1, {"model": {"w": torch.ones(2)}, "extra": bad}, {})
    assert "shared['extra']" in info.value.message and "torch.from_numpy" in info.value.hint
    assert _names(tmp_path) == []  # refused before anything was written


def test_module_and_optimizer_state_dicts_round_trip(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    for async_write in (False, True):
        ck = Checkpointer(tmp_path / str(async_write), rank=0, world_size=1, async_write=async_write)
        ck.save(1, {"model": model.state_dict(), "optimizer": opt.state_dict()}, {})
        ck.close()
        loaded = ck.latest()
        clone = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        clone.load_state_dict(loaded.shared["model"])
        opt2 = torch.optim.SGD(clone.parameters(), lr=0.5)
        opt2.load_state_dict(loaded.shared["optimizer"])
        for a, b in zip(model.state_dict().values(), clone.state_dict().values()):
            assert torch.equal(a, b)
        assert opt2.param_groups[0]["lr"] == 0.1
        assert torch.equal(
            opt2.state[opt2.param_groups[0]["params"][0]]["momentum_buffer"],
            opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"],
        )


def _draws() -> tuple:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), random.gauss(0, 1)


def test_rng_state_survives_a_checkpoint(tmp_path: Path) -> None:
    random.gauss(0, 1)  # leave a cached gaussian in python's state: it must be captured too
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    ck.save(1, {}, {"rng": rng_state()})
    expected = _draws()
    _draws()  # move every generator on
    set_rng_state(ck.latest().rank_state["rng"])
    assert _draws() == expected


def test_async_save_snapshots_before_returning(tmp_path: Path) -> None:
    weights = torch.zeros(8 << 20)  # 32 MB: the writer is still busy when we overwrite it
    ck = Checkpointer(tmp_path, rank=0, world_size=1, async_write=True)
    ck.save(1, {"w": weights}, {"r": torch.ones(2)})
    weights.fill_(5.0)  # training goes on and changes the parameters in place
    ck.wait()
    loaded = ck.latest()
    assert loaded.step == 1 and float(loaded.shared["w"].abs().max()) == 0.0


def test_snapshot_buffers_are_reused_until_shape_changes() -> None:
    buffers = disk.TensorBuffers()
    buffers.begin()
    first = buffers.copy("a", torch.ones(4))
    buffers.copy("gone", torch.ones(1))
    buffers.end()
    buffers.begin()
    second = buffers.copy("a", torch.full((4,), 2.0))
    buffers.end()
    assert second is first and second.data_ptr() == first.data_ptr()
    assert torch.equal(first, torch.full((4,), 2.0)) and buffers.buffer("gone") is None
    buffers.begin()
    third = buffers.copy("a", torch.ones(5, dtype=torch.float64))
    buffers.end()
    assert third is not first and third.dtype == torch.float64 and len(buffers) == 1


def test_async_checkpointer_reuses_buffers_across_saves(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1, async_write=True)
    state = {"model": {"w": torch.ones(1000)}}
    ck.save(1, state, {})
    ptr = ck._buffers["shared"].buffer("shared['model']['w']").data_ptr()
    state["model"]["w"].add_(1)
    ck.save(2, state, {})
    assert ck._buffers["shared"].buffer("shared['model']['w']").data_ptr() == ptr
    ck.close()
    assert torch.equal(ck.latest().shared["model"]["w"], torch.full((1000,), 2.0))


def test_async_second_save_waits_for_the_first(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=1, async_write=True)
    ck.save(1, {"w": torch.zeros(4 << 20)}, {})
    ck.save(2, {"w": torch.zeros(4 << 20)}, {})
    assert (tmp_path / "step-1" / "COMPLETE").is_file()  # committed before save(2) returned
    ck.close()
    assert ck.latest().step == 2
    with pytest.raises(CheckpointError, match="after close"):
        ck.save(3, {}, {})


def test_async_error_surfaces_on_wait_and_close(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=2, async_write=True, finalize_timeout=0.3)
    ck.save(1, {"w": torch.ones(2)}, {})  # rank 1 never writes: the writer thread times out
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1\]") as info:
        ck.wait()
    assert "finalize_timeout" in info.value.hint
    ck.wait()  # reported once
    ck.save(2, {"w": torch.ones(2)}, {})
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1\]"):
        ck.close()
    assert ck.latest() is None


def _all_exist(paths: list[Path]) -> Callable[[], bool]:
    return lambda: all(path.exists() for path in paths)


def _save_steps(directory: Path, world: int, async_write: bool, steps: range) -> None:
    cks = [
        Checkpointer(directory, rank=r, world_size=world, keep=2, async_write=async_write, finalize_timeout=30)
        for r in range(world)
    ]

    def body(rank: int) -> None:
        for step in steps:
            # Alternate who arrives last: rank 0 must wait for late ranks, late rank 0 must not care.
            if (rank == 0) == (step % 2 == 0):  # late: only once the others' files are in
                partial = directory / f".step-{step}.partial"
                first = [partial / f"rank-{r}.pt" for r in range(world) if (r == 0) != (rank == 0)]
                names = ", ".join(path.name for path in first)
                eventually(
                    _all_exist(first), timeout=HUNG_S, interval=0.005, what=f"{names} in {partial} before rank {rank}'s"
                )
            shared = _shared(step, size=50_000) if rank == 0 else None
            cks[rank].save(step, shared, {"rank": rank, "step": step, "t": torch.full((rank + 1,), step)})
        cks[rank].close()

    _run_ranks(world, body)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("async_write", [False, True], ids=["sync", "async"])
def test_ranks_as_threads_commit_one_folder_per_step(tmp_path: Path, world: int, async_write: bool) -> None:
    _save_steps(tmp_path, world, async_write, range(1, 6))
    assert _names(tmp_path) == ["latest", "step-4", "step-5"]
    ranks = [f"rank-{r}.pt" for r in range(world)]
    for step in (4, 5):
        assert _names(tmp_path / f"step-{step}") == sorted(["COMPLETE", "shared.pt", *ranks])
    for rank in range(world):
        loaded = Checkpointer(tmp_path, rank=rank, world_size=world).latest()
        assert loaded.step == 5 and loaded.world_size == world
        assert loaded.rank_state["rank"] == rank and loaded.rank_state["step"] == 5
        assert torch.equal(loaded.shared["model"]["w"], torch.full((50_000,), 5.0))


_RANK_SCRIPT = """
import sys, torch
from pathlib import Path
from dist_jobs.train.checkpoint.checkpointer import Checkpointer
from dist_jobs.train.rng import rng_state
directory, rank, world, mode = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ck = Checkpointer(directory, rank=rank, world_size=world, keep=2, async_write=mode == "async",
                  finalize_timeout=60)
print("ready", flush=True)
for step in (1, 2, 3):
    shared = {"w": torch.full((100_000,), float(step))} if rank == 0 else None
    ck.save(step, shared, {"rank": rank, "rng": rng_state()})
ck.close()
"""


def _spawn_rank(directory: Path, rank: int, world: int, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", _RANK_SCRIPT, str(directory), str(rank), str(world), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("async_write", [False, True], ids=["sync", "async"])
def test_ranks_as_processes(tmp_path: Path, async_write: bool) -> None:
    world, mode = 3, "async" if async_write else "sync"
    procs = [_spawn_rank(tmp_path, 0, world, mode)]
    try:
        # Rank 0 removes stale partial folders when constructed, so it must exist before the others
        # write (in training, the first all-reduce orders this); then all ranks race on every step.
        assert procs[0].stdout.readline().strip() == "ready"
        procs += [_spawn_rank(tmp_path, r, world, mode) for r in range(1, world)]
        outputs = [p.communicate(timeout=HUNG_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, outputs
    assert _names(tmp_path) == ["latest", "step-2", "step-3"]
    assert _names(tmp_path / "step-3") == ["COMPLETE", "rank-0.pt", "rank-1.pt", "rank-2.pt", "shared.pt"]
    assert Checkpointer(tmp_path, rank=2, world_size=world).latest().rank_state["rank"] == 2


class _WithShards(Checkpointer):
    """Each rank also writes a file of its own before its rank file, as the sharded one does."""

    def _write_others(self, step: int) -> dict[str, dict]:
        name = f"shard-{self.rank}.bin"
        digest = disk.write_atomic(self._partial(step) / name, lambda f: f.write(os.urandom(4096)))
        return {name: digest}


@pytest.mark.parametrize("damaged", [0, 3])
def test_a_rank_file_vouches_for_its_ranks_other_files_in_a_smaller_world_too(tmp_path: Path, damaged: int) -> None:
    """Written by 4 ranks, read by 2: rank r checks the files of ranks r and r + 2, so a flipped
    byte in any rank's file makes exactly the reader that checks it refuse the checkpoint."""
    cks = [_WithShards(tmp_path, rank=r, world_size=4, finalize_timeout=30) for r in range(4)]
    _run_ranks(4, lambda r: cks[r].save(7, _shared(7) if r == 0 else None, {"rank": r}))
    shard = tmp_path / "step-7" / f"shard-{damaged}.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    checker = damaged % 2
    with pytest.raises(ValueError, match=rf"shard-{damaged}\.bin is damaged: .*rank-{damaged}\.pt says"):
        Checkpointer(tmp_path, rank=checker, world_size=2).load(7)
    assert Checkpointer(tmp_path, rank=1 - checker, world_size=2).load(7).step == 7
    assert Checkpointer(tmp_path, rank=5, world_size=6).load(7).rank_state is None  # a rank the saving world lacked
