"""Code snapshots (dist_jobs.backends.snapshot): what is copied, what is recorded, the size guard,
a plan that writes nothing and a copy that lands where it planned, and a SLURM spec that runs from
the copy while its logs and checkpoints stay where they were."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dist_jobs.backends.base import SnapshotPlan
from dist_jobs.backends.slurm import SlurmBackend
from dist_jobs.backends.snapshot import RECORD, describe, plan, take
from dist_jobs.errors import UsageError
from dist_jobs.spec import JobSpec
from dist_jobs.spec.load import load_spec
from support.git_project import git, make_project

NOON = time.mktime((2026, 11, 28, 12, 0, 0, 0, 0, -1))  # the clock a snapshot's folder is named for


def copy_of(source: Path, into: Path, exclude: tuple[Path, ...] = (), limit: int | None = None) -> dict[str, object]:
    """A snapshot of `source` under `into` (plan, then take), as a job's would be taken."""
    spec = load_spec(data={"name": "r", "procs_per_node": 1})
    _, planned = plan(spec, source, into, time.time())
    planned = SnapshotPlan(planned.source, planned.dest, exclude)
    return take(planned) if limit is None else take(planned, limit)


def job(**fields: object) -> JobSpec:
    return load_spec(data={"name": "r", "procs_per_node": 1, "snapshot": True, **fields})


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(
        tmp_path / "proj",
        {"train.py": "print('committed')\n", "pkg/model.py": "X = 1\n", ".gitignore": "data/\n*.ckpt\n"},
        {
            "train.py": "print('edited, not committed')\n",
            "notes.py": "untracked = True\n",
            "data/big.bin": b"0" * 1000,
            "w.ckpt": b"1",
        },
    )


def test_a_git_snapshot_has_tracked_and_unignored_files_as_on_disk_and_records_the_commit(
    project: Path, tmp_path: Path
) -> None:
    record = copy_of(project, tmp_path / "runs")
    copy = Path(str(record["dir"]))
    files = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert files == [".gitignore", RECORD, "notes.py", "pkg/model.py", "train.py"]
    assert (copy / "train.py").read_text() == "print('edited, not committed')\n"
    head = git(project, "rev-parse", "HEAD").strip()
    assert record["commit"] == head and record["dirty"] is True
    assert json.loads((copy / RECORD).read_text())["commit"] == head
    assert describe(record) == f"snapshot of {head[:12]} (with uncommitted changes) in {copy}"
    git(project, "add", "-A")
    git(project, "commit", "-qm", "second")
    assert copy_of(project, tmp_path / "runs")["dirty"] is False


def test_without_git_data_and_checkpoint_folders_are_left_out_and_too_much_is_refused(tmp_path: Path) -> None:
    proj = tmp_path / "plain"
    for folder in ("src", "data", "checkpoints", "__pycache__", "mine"):
        (proj / folder).mkdir(parents=True)
        (proj / folder / "f").write_bytes(b"x" * 100)
    record = copy_of(proj, tmp_path / "runs", exclude=(proj / "mine",))
    copy = Path(str(record["dir"]))
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("f")) == ["src/f"]
    assert record["commit"] is None and record["dirty"] is None
    (proj / "src" / "huge").write_bytes(b"x" * 5000)
    with pytest.raises(UsageError) as caught:
        copy_of(proj, tmp_path / "runs", limit=1000)
    assert "more than the" in caught.value.message and "src" in caught.value.message
    assert "snapshot: false" in (caught.value.hint or "")


def test_a_snapshot_spec_runs_from_the_copy_and_keeps_its_logs_and_checkpoints(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{project / 'pkg'}:/elsewhere")
    runs = project / "dist-jobs-runs"  # inside the code folder: never copied into itself
    snap, planned = plan(job(), project, runs, NOON)
    copy = Path(snap.workdir or "")
    assert copy == planned.dest == runs / "snapshots" / f"r-20261128-120000-{os.getpid()}"
    assert (snap.log_dir, snap.checkpoint_dir) == (str(project / "logs"), str(project / "checkpoints"))
    assert snap.env["PYTHONPATH"] == f"{copy / 'pkg'}:/elsewhere"
    from dist_jobs.api import render  # not dist_jobs.render: once imported, that name is the subpackage

    assert f"#SBATCH --chdir={copy}" in render(snap, "slurm")
    assert not runs.exists()  # planned: nothing written yet
    assert take(planned)["dir"] == str(copy)
    assert (copy / "train.py").is_file() and not (copy / "dist-jobs-runs").exists()


def test_a_plan_names_a_folder_no_snapshot_has_taken_and_a_copy_never_lands_elsewhere(
    project: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    _, first = plan(job(), project, runs, NOON)
    assert plan(job(), project, runs, NOON)[1] == first  # nothing taken yet: the same folder again
    take(first)
    _, second = plan(job(), project, runs, NOON)
    assert second.dest == first.dest.with_name(first.dest.name + "-1")
    with pytest.raises(UsageError) as caught:  # a plan whose folder was taken since: refused, not moved
        take(first)
    assert f"{first.dest} exists already" in caught.value.message
    assert sorted(p.name for p in (runs / "snapshots").iterdir()) == [first.dest.name]


def test_too_much_code_is_refused_by_the_plan_before_anything_is_written(tmp_path: Path) -> None:
    proj = tmp_path / "plain"
    proj.mkdir()
    (proj / "weights.bin").write_bytes(b"x" * 5000)
    with pytest.raises(UsageError) as caught:
        plan(job(), proj, tmp_path / "runs", NOON, limit=1000)
    assert "more than the" in caught.value.message and "weights.bin" in caught.value.message
    assert not (tmp_path / "runs").exists()


def test_a_slurm_sweep_runs_every_trial_from_one_snapshot_unless_the_spec_says_no(tmp_path: Path) -> None:
    from dist_jobs.api.sweep_submit import _snapshot_overrides

    proj = tmp_path / "plain"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    spec = proj / "job.yaml"
    spec.write_text("name: sw\nprocs_per_node: 1\n")
    slurm = SlurmBackend(cwd=proj, jobs_dir=proj / "dist-jobs-runs")
    got = _snapshot_overrides(spec, {"nodes": 2}, slurm)
    copy = Path(got["workdir"])
    assert copy.parent == proj / "dist-jobs-runs" / "snapshots" and (copy / "train.py").is_file()
    assert got["snapshot"] is True and got["nodes"] == 2 and got["checkpoint_dir"] == str(proj / "checkpoints")
    assert _snapshot_overrides(spec, {"snapshot": False}, slurm) == {"snapshot": False}
