"""On the real SLURM cluster: a job submitted with a snapshot, held in the queue while its script is
edited, runs the code as it was submitted once released (and status names the commit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dist_jobs
from support.git_project import git
from support.tiers import requires
from support.waiting import HUNG_S

pytestmark = [requires("slurm"), pytest.mark.timeout(240)]
SCRIPT = "import sys\nopen(sys.argv[1], 'w').write({!r})\n"


def test_a_held_job_edited_in_the_queue_runs_the_code_as_submitted(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT.format("as committed"))
    git(proj, "init", "-q")
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "first")
    head = git(proj, "rev-parse", "HEAD").strip()
    (proj / "train.py").write_text(SCRIPT.format("as submitted"))  # uncommitted: the tree is dirty
    out = tmp_path / "out.txt"
    spec = dist_jobs.load_spec(
        data={
            "name": "snap",
            "procs_per_node": 1,
            "time": "5",
            "log_dir": str(tmp_path / "logs"),
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "command": [sys.executable, "train.py", str(out)],
            "slurm": {"extra_sbatch": ["--hold"]},
            "snapshot": True,
        }
    )
    job = dist_jobs.submit(spec, "slurm", cwd=proj, jobs_dir=tmp_path / "runs")
    try:
        held = job.status()
        assert held.state.value == "pending" and "JobHeld" in held.detail, held
        assert f"snapshot of {head[:12]} (with uncommitted changes)" in held.extra["code"]
        (proj / "train.py").write_text(SCRIPT.format("edited while queued"))
        subprocess.run(["scontrol", "release", job.id], check=True, capture_output=True)
        info = job.wait(timeout=HUNG_S, raise_on_failure=True)
    finally:
        subprocess.run(["scancel", job.id], capture_output=True)
    assert out.read_text() == "as submitted"
    assert "snapshot of" in info.extra["code"]
