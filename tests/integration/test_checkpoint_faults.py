"""Checkpoint faults: SIGKILL mid-write, full disk, corrupt newest, partial folders, world size change."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.paths import REPO
from support.tiers import require_module, requires
from support.waiting import HUNG_S, eventually

torch = require_module("torch")

from dist_jobs.train.checkpoint import write as disk  # noqa: E402
from dist_jobs.train.checkpoint.checkpointer import Checkpointer, CheckpointError  # noqa: E402


def _names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def _state(step: int, numel: int = 1000) -> dict:
    return {"model": {"w": torch.full((numel,), float(step))}, "step": step}


def _two_checkpoints(directory: Path) -> Checkpointer:
    ck = Checkpointer(directory, rank=0, world_size=1)
    ck.save(1, _state(1, 1 << 16), {"r": 1})
    ck.save(2, _state(2, 1 << 16), {"r": 2})
    ck.wait()  # its pointer and pruning are done: the test is alone in the folder now
    return ck


# -- (a) SIGKILL while the partial folder is being written --------------------------------------
_KILL_SCRIPT = """
import sys, torch
from pathlib import Path
from dist_jobs.train.checkpoint.checkpointer import Checkpointer
ck = Checkpointer(Path(sys.argv[1]), rank=0, world_size=1, async_write=sys.argv[2] == "async")
ck.save(1, {"w": torch.ones(4)}, {"r": 1})
ck.wait()
big = {f"t{i}": torch.ones(8 << 20) for i in range(16)}  # 512 MB: writing it takes a while
print("committed", flush=True)
ck.save(2, big, {"r": 2})
ck.wait()
print("finished", flush=True)
"""


def _kill_when_writing(proc: subprocess.Popen, partial: Path, timeout: float) -> None:
    tmp = ".shared.pt.*.tmp"  # the atomic writer's temporary name: .<name>.<pid>.<random>.tmp
    eventually(
        lambda: any(f.stat().st_size > (16 << 20) for f in partial.glob(tmp)),  # well inside the 512 MB write
        retry_on=(FileNotFoundError,),
        timeout=timeout,
        interval=0.002,
        what=f"{partial / tmp} growing",
        give_up=lambda: proc.poll() is not None,
        context=lambda: f"writer exited with {proc.poll()}",
    )
    proc.send_signal(signal.SIGKILL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_mid_write_keeps_previous_checkpoint(tmp_path: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_SCRIPT, str(tmp_path), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "committed"
        _kill_when_writing(proc, tmp_path / ".step-2.partial", 60)
        assert proc.wait(timeout=HUNG_S) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ".step-2.partial" in _names(tmp_path) and "step-2" not in _names(tmp_path)
    assert (tmp_path / "latest").read_text().strip() == "step-1"
    reader = Checkpointer(tmp_path, rank=1, world_size=2)  # a non-zero rank leaves folders alone
    loaded = reader.latest()
    assert loaded.step == 1 and loaded.rank_state is None and torch.equal(loaded.shared["w"], torch.ones(4))
    ck = Checkpointer(tmp_path, rank=0, world_size=1)  # the restarted rank 0 clears the debris
    assert _names(tmp_path) == ["latest", "step-1"]
    ck.save(2, {"w": torch.zeros(4)}, {"r": 2})
    assert ck.latest().step == 2


# -- (b) full disk -------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert done.returncode == 0, f"cannot mount a 2 MiB tmpfs to fill: {done.stderr.strip()}"
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _assert_disk_full_error(exc: CheckpointError, run: Path) -> None:
    assert "disk full" in exc.message and str(run / "step-2") in exc.message
    assert "needs at least" in exc.message and "free" in exc.message
    assert "free space" in exc.hint and "previous checkpoint is intact" in exc.hint


def _assert_previous_survives(run: Path) -> None:
    assert _names(run) == ["latest", "step-1"]  # no partial folder, no temporary file
    loaded = Checkpointer(run, rank=0, world_size=1).latest()
    assert loaded.step == 1 and torch.equal(loaded.shared["model"]["w"], torch.full((1000,), 1.0))


@requires("root")  # mounts the tmpfs
def test_disk_full_detected_before_writing(small_disk: Path) -> None:
    run = small_disk / "run"
    ck = Checkpointer(run, rank=0, world_size=1)
    ck.save(1, _state(1), {"r": 1})
    with pytest.raises(CheckpointError) as info:
        ck.save(2, _state(2, 1 << 20), {"r": 2})  # 4 MiB of tensors on a 2 MiB volume
    _assert_disk_full_error(info.value, run)
    assert f"{4 << 20} bytes" in info.value.message
    _assert_previous_survives(run)


def _free_lies_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the up-front space check pass once so that the write itself hits ENOSPC."""
    real, calls = disk.free_bytes, []

    def fake(directory: Path) -> int:
        calls.append(directory)
        return 1 << 40 if len(calls) == 1 else real(directory)

    monkeypatch.setattr(disk, "free_bytes", fake)


@requires("root")  # mounts the tmpfs
@pytest.mark.parametrize("async_write", [False, True], ids=["sync", "async"])
def test_disk_full_while_writing(small_disk: Path, monkeypatch: pytest.MonkeyPatch, async_write: bool) -> None:
    run = small_disk / "run"
    ck = Checkpointer(run, rank=0, world_size=1, async_write=async_write)
    ck.save(1, _state(1), {"r": 1})
    ck.wait()
    free_before = shutil.disk_usage(small_disk).free
    _free_lies_once(monkeypatch)
    with pytest.raises(CheckpointError) as info:
        ck.save(2, _state(2, 3 << 18), {"r": 2})  # 3 MiB: ENOSPC in the middle of shared.pt
        ck.wait()  # async: the writer thread's error surfaces here
    _assert_disk_full_error(info.value, run)
    _assert_previous_survives(run)
    assert shutil.disk_usage(small_disk).free == free_before  # the torn file was removed too
    ck.save(3, _state(3), {"r": 3})  # and the disk is usable again
    ck.close()
    assert ck.latest().step == 3


# -- (c) corrupt newest --------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def _flip_tensor_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensor payload: torch.load still succeeds
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True, map_location="cpu")


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)  # opening it to read would wait for a writer forever


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("damage", "target"),
    [
        (_truncate, "shared.pt"),
        (_garbage, "shared.pt"),
        (_flip_tensor_byte, "shared.pt"),
        (_truncate, "rank-0.pt"),
        (Path.unlink, "shared.pt"),
        (_garbage, "COMPLETE"),
        (_truncate, "COMPLETE"),
        (_fifo, "rank-0.pt"),
    ],
)
def test_corrupt_newest_is_reported_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], object], target: str
) -> None:
    _two_checkpoints(tmp_path)
    damage(tmp_path / "step-2" / target)
    caplog.set_level(logging.WARNING, logger="dist_jobs.train.checkpoint.checkpointer")
    loaded = Checkpointer(tmp_path, rank=0, world_size=1).latest()
    assert loaded.step == 1 and loaded.rank_state == {"r": 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(tmp_path / "step-2") in warnings[0]


def test_saving_a_step_again_replaces_the_corrupt_copy(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    _garbage(tmp_path / "step-2" / "shared.pt")
    ck = Checkpointer(tmp_path, rank=0, world_size=1, keep=2)
    assert ck.latest().step == 1  # resumes from step 1, trains, reaches step 2 again
    ck.save(2, _state(22), {"r": 22})
    loaded = ck.latest()
    assert loaded.step == 2 and loaded.rank_state == {"r": 22}
    ck.wait()  # the corrupt copy, set aside, goes with the pruning, on its thread
    assert _names(tmp_path) == ["latest", "step-1", "step-2"]


# -- (d) partial folders -------------------------------------------------------------------------
def test_partial_folders_do_not_count(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    shutil.copytree(tmp_path / "step-2", tmp_path / ".step-9.partial")  # crashed before its rename
    shutil.copytree(tmp_path / "step-2", tmp_path / ".step-8.partial")
    (tmp_path / ".step-8.partial" / "COMPLETE").unlink()  # crashed before COMPLETE
    shutil.copytree(tmp_path / "step-2", tmp_path / "step-7")
    (tmp_path / "step-7" / "COMPLETE").unlink()  # a step folder without its marker
    reader = Checkpointer(tmp_path, rank=1, world_size=2)
    assert reader.latest().step == 2
    assert ".step-9.partial" in _names(tmp_path)  # only rank 0 cleans up
    Checkpointer(tmp_path, rank=0, world_size=1)
    assert _names(tmp_path) == ["latest", "step-1", "step-2", "step-7"]


def test_stale_rank_file_of_a_crashed_run_is_not_committed(tmp_path: Path) -> None:
    stale = tmp_path / ".step-5.partial"
    stale.mkdir(parents=True)
    torch.save({"rank": "stale"}, stale / "rank-1.pt")
    cks = [Checkpointer(tmp_path, rank=r, world_size=2, finalize_timeout=30) for r in (0, 1)]
    threads = [
        threading.Thread(target=cks[r].save, args=(5, _state(5) if r == 0 else None, {"rank": r})) for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert Checkpointer(tmp_path, rank=1, world_size=2).latest().rank_state == {"rank": 1}


def test_missing_rank_times_out_and_keeps_previous(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, rank=0, world_size=2, finalize_timeout=0.2)
    helper = Checkpointer(tmp_path, rank=1, world_size=2)
    helper.save(1, None, {"rank": 1})
    ck.save(1, _state(1), {"rank": 0})
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1\] wrote no file") as info:
        ck.save(2, _state(2), {"rank": 0})
    assert str(tmp_path / "step-2") in info.value.message
    assert ck.latest().step == 1


# -- (e) world size change -----------------------------------------------------------------------
def _save_with_ranks(directory: Path, world: int) -> None:
    cks = [Checkpointer(directory, rank=r, world_size=world, finalize_timeout=30) for r in range(world)]
    threads = [
        threading.Thread(target=cks[r].save, args=(3, _state(3) if r == 0 else None, {"rank": r})) for r in range(world)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert (directory / "step-3" / "COMPLETE").is_file()


@pytest.mark.parametrize(("saved", "now"), [(2, 4), (4, 2)])
def test_world_size_change(tmp_path: Path, saved: int, now: int) -> None:
    _save_with_ranks(tmp_path, saved)
    for rank in range(now):
        loaded = Checkpointer(tmp_path, rank=rank, world_size=now).latest()
        assert loaded.step == 3 and loaded.world_size == saved
        assert torch.equal(loaded.shared["model"]["w"], torch.full((1000,), 3.0))
        assert loaded.rank_state == ({"rank": rank} if rank < saved else None)
