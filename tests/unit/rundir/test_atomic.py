"""dist_jobs.rundir.atomic: the one atomic writer, and the run directory's writers going through it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dist_jobs.backends.sweep_manifest import write_manifest
from dist_jobs.constants import PREEMPTED_MARKER
from dist_jobs.rundir import atomic
from dist_jobs.rundir.atomic import open_atomic, write_atomic, write_new
from dist_jobs.rundir.hang import HANG_RECORD, HangRecord, read_preempted, write_hang, write_preempted
from dist_jobs.rundir.progress import write_progress
from dist_jobs.rundir.result import write_result


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What was fsynced, in order: "file" or "dir"."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", spy)
    return seen


def test_write_atomic_replaces_the_file_and_syncs_it_then_its_folder(tmp_path: Path, synced: list[str]) -> None:
    target = tmp_path / "f.json"
    target.write_text("old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert synced == ["file", "dir"]
    assert os.listdir(tmp_path) == ["f.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), open_atomic(target) as fh:
        fh.write(b"half")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_write_new_keeps_the_first_writer(tmp_path: Path) -> None:
    target = tmp_path / "LOCK"
    assert write_new(target, "first")
    assert not write_new(target, "second")
    assert target.read_text() == "first"
    assert os.listdir(tmp_path) == ["LOCK"]


@pytest.mark.parametrize(
    ("write", "name"),
    [
        (lambda d: write_progress(d, {"step": 1}), "progress.json"),
        (lambda d: write_result(d, {"loss": 0.5}), "result.json"),
        (lambda d: write_manifest(d, {"members": []}), "sweep.json"),
        (lambda d: write_preempted(d, "7"), PREEMPTED_MARKER),
        (lambda d: write_hang(d, HangRecord(rank=0, step=3)), HANG_RECORD),
    ],
)
def test_run_directory_writers_are_durable(tmp_path: Path, synced: list[str], write, name: str) -> None:  # type: ignore[no-untyped-def]
    write(tmp_path)
    assert (tmp_path / name).exists()
    assert "file" in synced
    assert sorted(os.listdir(tmp_path)) == [name]


def test_the_preempted_marker_says_why(tmp_path: Path) -> None:
    write_preempted(tmp_path, "hang (rank 1)", "0123456789ab")
    marker = read_preempted(tmp_path)
    assert marker is not None and (marker.why, marker.stamp) == ("hang (rank 1)", "0123456789ab")
    assert marker.landed == (tmp_path / PREEMPTED_MARKER).stat().st_mtime
