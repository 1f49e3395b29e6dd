"""Resuming at scale: each rank opens and verifies only its own part, the ranks fall back together,
large files are memory-mapped, and markers written before the per-rank records still load."""

from __future__ import annotations

import builtins
import io
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support.tiers import require_module

torch = require_module("torch")

from dist_jobs.train.checkpoint import write as disk  # noqa: E402
from dist_jobs.train.checkpoint.checkpointer import Checkpointer  # noqa: E402
from dist_jobs.train.checkpoint.read import MAP_FROM, newest_agreed  # noqa: E402


class ThreadWorld:
    """`world` ranks as threads, with the element-wise max all_reduce that training passes as `agree`."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._barrier = threading.Barrier(world, timeout=30)
        self._lock = threading.Lock()
        self._sum: list[int] = []
        self.rounds = 0

    def agree(self, values: list[int]) -> list[int]:
        with self._lock:
            self._sum = list(values) if not self._sum else [max(a, b) for a, b in zip(self._sum, values)]
        if self._barrier.wait() == 0:
            self.rounds += 1
        out = list(self._sum)
        if self._barrier.wait() == 0:
            self._sum = []
        self._barrier.wait()  # nobody starts the next round before everyone read this one
        return out

    def run(self, body: Callable[[int], Any]) -> list[Any]:
        results: list[Any] = [None] * self.world
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                results[rank] = body(rank)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return results


def _save(folder: Path, world: int, steps: tuple[int, ...], numel: int = 1000) -> None:
    """Checkpoints of `world` ranks, written rank by rank in this thread (rank 0 last: it commits)."""
    first = Checkpointer(folder, rank=0, world_size=world, keep=len(steps) + 1, finalize_timeout=10)
    for step in steps:
        for rank in range(1, world):
            Checkpointer(folder, rank=rank, world_size=world).save(step, None, {"rank": rank, "step": step})
        first.save(step, {"w": torch.full((numel,), float(step))}, {"rank": 0, "step": step})
    first.close()  # its pointer and pruning run on a thread: done before the test reads the folder


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_bad_part_on_one_rank_makes_every_rank_fall_back_together(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = ThreadWorld(4)
    _save(tmp_path, 4, (1, 2, 3))
    _flip_middle_byte(tmp_path / "step-3" / "rank-2.pt")
    _flip_middle_byte(tmp_path / "step-2" / "rank-1.pt")
    caplog.set_level(logging.WARNING, logger="dist_jobs.train.checkpoint.checkpointer")
    cks = [Checkpointer(tmp_path, rank=r, world_size=4) for r in range(4)]
    # Alone, rank 0 sees nothing wrong: it no longer reads the other ranks' files.
    assert cks[0].latest().step == 3
    got = world.run(lambda rank: cks[rank].latest(world.agree))
    assert [g.step for g in got] == [1, 1, 1, 1] and [g.rank_state["rank"] for g in got] == [0, 1, 2, 3]
    assert world.rounds == 3  # one collective per checkpoint tried
    warnings = [r.getMessage() for r in caplog.records]
    assert any("step-3 is unusable on rank 2" in w and "rank-2.pt is damaged" in w for w in warnings), warnings
    assert any("step-2 is unusable on rank 1" in w for w in warnings), warnings
    assert all(c._bad == {2, 3} for c in cks)  # all rewrite the same steps when they reach them


def test_a_step_one_rank_does_not_see_is_skipped_by_all() -> None:
    # Rank 1's listing lacks step 9 (say, a stale directory cache): all must settle on 8.
    world = ThreadWorld(3)
    seen = {0: [7, 8, 9], 1: [7, 8], 2: [9, 8, 7]}
    rejected: list[list[int]] = [[], [], []]
    loads: list[list[int]] = [[], [], []]

    def body(rank: int) -> int | None:
        def load(step: int) -> int:
            loads[rank].append(step)
            return step

        return newest_agreed(seen[rank], load, lambda step, _: rejected[rank].append(step), world.agree)

    assert world.run(body) == [8, 8, 8]
    assert rejected == [[9], [9], [9]]
    assert loads == [[9, 8], [8], [9, 8]]  # rank 1 loaded 8 once and kept it while the others caught up


def test_no_checkpoint_anywhere_gives_none_on_every_rank() -> None:
    world = ThreadWorld(2)
    seen = {0: [], 1: [4]}  # rank 1 alone sees one: it is not usable by the job
    assert world.run(lambda rank: newest_agreed(seen[rank], lambda s: s, lambda *_: None, world.agree)) == [None, None]


@contextmanager
def _count_opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every path opened or listed through Python's file functions while the block runs."""
    opened: Counter[str] = Counter()

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(path, int):  # an open descriptor (fdopen) is not a new open
                opened[os.fspath(path)] += 1
            return real(path, *args, **kwargs)

        return wrapper

    with monkeypatch.context() as patch:
        for module, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "listdir"), (os, "scandir")):
            patch.setattr(module, name, counting(getattr(module, name)))
        patch.setattr(torch.UntypedStorage, "from_file", counting(torch.UntypedStorage.from_file))
        yield opened


def test_files_opened_per_rank_do_not_grow_with_the_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # writing 512 files is set-up, not the subject
    for world in (2, 512):
        _save(tmp_path / str(world), world, (5,))
    monkeypatch.undo()
    read: dict[int, int] = {}
    for world, rank in ((2, 1), (512, 1), (512, 300), (512, 511)):
        folder = tmp_path / str(world)
        ck = Checkpointer(folder, rank=rank, world_size=world)
        before = _bytes_read()
        with _count_opens(monkeypatch) as opened:
            loaded = ck.latest()
        read[world] = _bytes_read() - before
        assert loaded.step == 5 and loaded.rank_state == {"rank": rank, "step": 5}
        step = folder / "step-5"
        # The checkpoint folder listed once, then the marker, the shared file and its own file.
        want = {str(folder), str(step / "COMPLETE"), str(step / "shared.pt"), str(step / f"rank-{rank}.pt")}
        assert opened == Counter(want), (world, rank, opened)
    # Nor what it reads: the marker holds 510 rank records (32 KiB) more; a rank reads its own.
    marker = {world: (tmp_path / str(world) / "step-5" / "COMPLETE").stat().st_size for world in (2, 512)}
    assert marker[512] - marker[2] >= 510 * 64 and read[512] - read[2] < 8192, read


def _bytes_read() -> int:
    """Bytes this process has read through read()-like system calls (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_large_files_are_memory_mapped_and_still_verified(tmp_path: Path) -> None:
    numel = MAP_FROM // 4 + 1000  # float32: shared.pt is larger than MAP_FROM
    _save(tmp_path, 1, (1, 2), numel=numel)
    loaded = Checkpointer(tmp_path, rank=0, world_size=1).latest()
    shared = str(tmp_path / "step-2" / "shared.pt")
    assert loaded.step == 2 and torch.equal(loaded.shared["w"], torch.full((numel,), 2.0))
    assert shared in Path("/proc/self/maps").read_text()  # the tensor lives in the file's pages
    del loaded
    data = bytearray(Path(shared).read_bytes())
    data[-numel * 2] ^= 0x01  # a bit of the tensor payload: torch.load alone would not notice
    Path(shared).write_bytes(bytes(data))
    assert Checkpointer(tmp_path, rank=0, world_size=1).latest().step == 1


def test_marker_written_before_rank_records_still_loads(tmp_path: Path) -> None:
    _save(tmp_path, 2, (3,))
    step = tmp_path / "step-3"
    files = {name: disk.digest(step / name) for name in ("shared.pt", "rank-0.pt", "rank-1.pt")}
    (step / "COMPLETE").write_text(
        json.dumps({"step": 3, "world_size": 2, "version": "0.1.0", "files": files}, indent=1)
    )
    for rank in (0, 1):
        loaded = Checkpointer(tmp_path, rank=rank, world_size=2).latest()
        assert loaded.step == 3 and loaded.rank_state == {"rank": rank, "step": 3}
    _flip_middle_byte(step / "rank-1.pt")  # and it is still verified
    assert Checkpointer(tmp_path, rank=1, world_size=2).latest() is None


def test_restored_optimizer_state_leaves_the_mapped_file(tmp_path: Path) -> None:
    from dist_jobs.train.resume import _own_memory

    def build() -> tuple[Any, Any]:
        model = torch.nn.Linear(600, 600)  # 1.4 MB of weights: shared.pt is memory-mapped
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, opt = build()
    model(torch.randn(4, 600)).sum().backward()
    opt.step()
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    ck.save(1, {"model": model.state_dict(), "optimizer": opt.state_dict()}, {})
    loaded = ck.latest()
    clone, opt2 = build()
    clone.load_state_dict(loaded.shared["model"])
    opt2.load_state_dict(loaded.shared["optimizer"])
    momentum = opt2.state[clone.weight]["momentum_buffer"]
    assert momentum is loaded.shared["optimizer"]["state"][0]["momentum_buffer"]  # torch kept it as mapped
    _own_memory(opt2, loaded.shared["optimizer"])
    del loaded, momentum
    assert str(tmp_path / "step-1" / "shared.pt") not in Path("/proc/self/maps").read_text()
    want = opt.state[model.weight]["momentum_buffer"]
    assert torch.equal(opt2.state[clone.weight]["momentum_buffer"], want)
    clone(torch.randn(4, 600)).sum().backward()
    opt2.step()  # updates its momentum in place: the checkpoint must not change
    assert ck.latest().step == 1


def test_a_shared_mmap_default_never_writes_into_the_checkpoint(tmp_path: Path) -> None:
    import mmap

    numel = MAP_FROM // 4 + 1000
    _save(tmp_path, 1, (1, 2), numel=numel)
    with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):  # a user's global choice
        loaded = Checkpointer(tmp_path, rank=0, world_size=1).latest()
    loaded.shared["w"].add_(1.0)  # training updates a loaded tensor in place
    del loaded
    assert Checkpointer(tmp_path, rank=0, world_size=1).latest().step == 2  # step-2 still verifies
