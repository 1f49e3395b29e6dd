"""The record of the jobs submitted from this machine (dist_jobs.backends.records)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dist_jobs.backends import records
from dist_jobs.backends.records import Submitted


def test_a_record_is_read_back_absolute_by_its_backend_and_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    records.record(Submitted("slurm", "12", "ck/run", "logs", "dist-jobs-runs/run-12"))
    found = records.recorded("slurm", "12")
    assert found is not None
    assert found == Submitted("slurm", "12", str(tmp_path / "ck/run"), str(tmp_path / "logs"), found.job_dir)
    assert found.job_dir == str(tmp_path / "dist-jobs-runs" / "run-12") and found.run.run == "run"
    assert records.recorded("slurm", "13") is None and records.recorded("local", "12") is None


def test_every_lists_a_backends_jobs_oldest_first_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    ids = ["/a-b/c", "/a/b-c", "/x"]  # the first two read alike as file names
    for when, job_id in enumerate(ids):
        records.record(Submitted("local", job_id, job_id))
        path = next(p for p in records.folder("local").glob("*.json") if json.loads(p.read_text())["job_id"] == job_id)
        os.utime(path, (1000 + when, 1000 + when))
    (records.folder("local") / "junk.json").write_text("{not json")
    assert [job.job_id for job in records.every("local")] == ids
    records.record(Submitted("local", "/x", "/elsewhere"))  # submitted again: replaced
    assert records.recorded("local", "/x") == Submitted("local", "/x", "/elsewhere")
    assert records.every("slurm") == []
