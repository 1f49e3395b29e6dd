"""Code snapshots (dist_jobs.backends.snapshot): what is copied, what is recorded, the size guard,
and a SLURM spec that runs from the copy while its logs and checkpoints stay where they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_jobs.backends.slurm import SlurmBackend
from dist_jobs.backends.snapshot import RECORD, describe, take
from dist_jobs.errors import UsageError
from support.git_project import git, make_project


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
    record = take(project, tmp_path / "runs", "r", exclude=[])
    copy = Path(record["dir"])
    files = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert files == [".gitignore", RECORD, "notes.py", "pkg/model.py", "train.py"]
    assert (copy / "train.py").read_text() == "print('edited, not committed')\n"
    head = git(project, "rev-parse", "HEAD").strip()
    assert record["commit"] == head and record["dirty"] is True
    assert json.loads((copy / RECORD).read_text())["commit"] == head
    assert describe(record) == f"snapshot of {head[:12]} (with uncommitted changes) in {copy}"
    git(project, "add", "-A")
    git(project, "commit", "-qm", "second")
    assert take(project, tmp_path / "runs", "r", exclude=[])["dirty"] is False


def test_without_git_data_and_checkpoint_folders_are_left_out_and_too_much_is_refused(tmp_path: Path) -> None:
    proj = tmp_path / "plain"
    for folder in ("src", "data", "checkpoints", "__pycache__", "mine"):
        (proj / folder).mkdir(parents=True)
        (proj / folder / "f").write_bytes(b"x" * 100)
    record = take(proj, tmp_path / "runs", "r", exclude=[proj / "mine"])
    copy = Path(record["dir"])
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("f")) == ["src/f"]
    assert record["commit"] is None and record["dirty"] is None
    (proj / "src" / "huge").write_bytes(b"x" * 5000)
    with pytest.raises(UsageError) as caught:
        take(proj, tmp_path / "runs", "r", exclude=[], limit=1000)
    assert "more than the" in caught.value.message and "src" in caught.value.message
    assert "snapshot: false" in (caught.value.hint or "")


def test_a_snapshot_spec_runs_from_the_copy_and_keeps_its_logs_and_checkpoints(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dist_jobs
    from dist_jobs.backends.slurm.submit import snapshot_spec

    monkeypatch.setenv("PYTHONPATH", f"{project / 'pkg'}:/elsewhere")
    spec = dist_jobs.load_spec(data={"name": "r", "procs_per_node": 1, "snapshot": True})
    runs = project / "dist-jobs-runs"  # inside the code folder: never copied into itself
    snap = snapshot_spec(spec, project, runs)
    copy = Path(snap.workdir or "")
    assert copy.parent == runs / "snapshots" and (copy / "train.py").is_file()
    assert not (copy / "dist-jobs-runs").exists()
    assert (snap.log_dir, snap.checkpoint_dir) == (str(project / "logs"), str(project / "checkpoints"))
    assert snap.env["PYTHONPATH"] == f"{copy / 'pkg'}:/elsewhere"
    from dist_jobs.api import render  # not dist_jobs.render: once imported, that name is the subpackage

    script = render(snap, "slurm")
    assert f"#SBATCH --chdir={copy}" in script


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
