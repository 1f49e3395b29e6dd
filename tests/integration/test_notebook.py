"""examples/notebook.ipynb runs headless, top to bottom: the local backend, and the test SLURM
cluster where `sbatch` exists (its cells assert the jobs succeeded and their results)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from support.paths import REPO
from support.tiers import require_module, requires

pytestmark = [requires("torch"), pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("cluster", [pytest.param("slurm", marks=requires("slurm")), "local"])
def test_the_notebook_runs_headless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: str) -> None:
    """Slow by nature: the notebook's kernel starts, and its cells submit and wait for real jobs."""
    nbformat = require_module("nbformat", "pip install 'dist-jobs[dev]' (nbclient, ipykernel)")
    nbclient = require_module("nbclient", "pip install 'dist-jobs[dev]' (nbclient, ipykernel)")
    require_module("ipykernel", "pip install 'dist-jobs[dev]' (nbclient, ipykernel)")
    monkeypatch.setenv("DIST_JOBS_NOTEBOOK_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if cluster == "local":  # the same notebook where there is no SLURM: its SLURM cell says so
        monkeypatch.setenv(
            "PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not _has_sbatch(p))
        )
    notebook = nbformat.read(REPO / "examples" / "notebook.ipynb", as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=700, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = "".join(
        out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "local://" in printed and "succeeded (COMPLETED)" in printed
    assert "failed as expected: failed rank 1 exit 3" in printed  # result() of a failed job raised JobFailed
    assert ("slurm://" in printed) == (cluster == "slurm"), printed
    assert (tmp_path / "checkpoints" / "notebook-local" / "result.json").is_file()


def _has_sbatch(folder: str) -> bool:
    return bool(folder) and shutil.which("sbatch", path=folder) is not None
