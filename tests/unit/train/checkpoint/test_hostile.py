"""Damaged checkpoints: a FIFO in a committed step and a checkpoint without the keys resuming reads
both make latest() fall back to the previous checkpoint, at once, instead of hanging or failing."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from support.tiers import require_module

torch = require_module("torch")

from dist_jobs.train.checkpoint.checkpointer import Checkpointer, Loaded  # noqa: E402
from dist_jobs.train.resume import check_content  # noqa: E402
from dist_jobs.train.rng import rng_state  # noqa: E402


def _state(step: int) -> dict:
    """What dist_jobs.train.resume.shared_state writes, in miniature."""
    return {
        "model": {"w": torch.full((4,), float(step))},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {"last_epoch": step},
        "scaler": {},
        "epoch": 0,
        "step": step,
        "batches_in_epoch": step,
        "samples_in_epoch": step * 8,
        "samples_seen": step * 8,
        "sampler_seed": 0,
        "world_size": 1,
        "global_batch": 8,
        "config": {},
        "version": "x",
        "metrics": {},
    }


def _latest_within(ckpt: Checkpointer, seconds: float = 20) -> Loaded | None:
    """latest() on a thread, so that a hang fails the test instead of the suite."""
    found: list[Loaded | None] = []
    worker = threading.Thread(target=lambda: found.append(ckpt.latest(accept=check_content)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "latest() hangs on the damaged checkpoint"
    return found[0]


def _two_steps(tmp_path: Path, second: dict) -> Checkpointer:
    ckpt = Checkpointer(tmp_path / "run", rank=0, world_size=1)
    ckpt.save(4, _state(4), {"rng": rng_state(), "rank": 0})
    ckpt.save(8, second, {"rng": rng_state(), "rank": 0})
    return ckpt


def test_fifo_as_shared_pt_falls_back_without_hanging(tmp_path: Path) -> None:
    ckpt = _two_steps(tmp_path, _state(8))
    shared = tmp_path / "run" / "step-8" / "shared.pt"
    shared.unlink()
    os.mkfifo(shared)
    loaded = _latest_within(ckpt)
    assert loaded is not None and loaded.step == 4


def test_a_device_named_in_complete_is_not_read(tmp_path: Path) -> None:
    ckpt = _two_steps(tmp_path, _state(8))
    step = tmp_path / "run" / "step-8"
    # A marker in the older all-JSON format that names a device instead of rank-0.pt: file names
    # are fixed, never taken from the marker, so nothing reads /dev/zero and the step is unusable.
    head = json.loads((step / "COMPLETE").read_text().splitlines()[0])
    record = {"size": 1 << 40, "crc32": "00000000"}
    legacy = {
        "step": 8,
        "world_size": 1,
        "files": {"shared.pt": head["files"]["shared.pt"], "../../../../../../../../dev/zero": record},
    }
    (step / "COMPLETE").write_text(json.dumps(legacy, indent=1))
    loaded = _latest_within(ckpt)
    assert loaded is not None and loaded.step == 4


@pytest.mark.parametrize("missing", ["sampler_seed", "scheduler", "metrics"])
def test_missing_keys_fall_back_to_the_previous_checkpoint(tmp_path: Path, missing: str) -> None:
    state = _state(8)
    del state[missing]
    loaded = _latest_within(_two_steps(tmp_path, state))
    assert loaded is not None and loaded.step == 4


def test_a_complete_checkpoint_is_accepted(tmp_path: Path) -> None:
    loaded = _latest_within(_two_steps(tmp_path, _state(8)))
    assert loaded is not None and loaded.step == 8
    shutil.rmtree(tmp_path / "run" / "step-4")
    assert _latest_within(Checkpointer(tmp_path / "run", rank=0, world_size=1)).step == 8  # type: ignore[union-attr]


def _warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "dist_jobs.train.checkpoint.checkpointer")


def test_a_missing_shared_pt_is_named_with_its_path_and_what_was_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dist_jobs.train.checkpoint.checkpointer")
    ckpt = _two_steps(tmp_path, _state(8))
    shared = tmp_path / "run" / "step-8" / "shared.pt"
    shared.unlink()
    loaded = _latest_within(ckpt)
    assert loaded is not None and loaded.step == 4
    said = _warnings(caplog)
    assert f"{shared} is missing" in said and "resuming from the newest older checkpoint" in said, said


def test_a_marker_without_shared_pts_record_is_named_not_quoted_as_a_bare_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning once read only `falling back: 'shared.pt'` (a KeyError's text)."""
    caplog.set_level(logging.WARNING, logger="dist_jobs.train.checkpoint.checkpointer")
    ckpt = _two_steps(tmp_path, _state(8))
    marker = tmp_path / "run" / "step-8" / "COMPLETE"
    head, _, records = marker.read_text().partition("\n")
    fields = json.loads(head)
    del fields["files"]["shared.pt"]
    marker.write_text(json.dumps(fields) + "\n" + records)
    loaded = _latest_within(ckpt)
    assert loaded is not None and loaded.step == 4
    said = _warnings(caplog)
    assert f"{marker} records no size and CRC32 for {marker.parent / 'shared.pt'}" in said, said
    assert "resuming from the newest older checkpoint every rank can load" in said
