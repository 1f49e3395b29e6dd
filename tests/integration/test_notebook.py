"""examples/notebook.ipynb runs headless, top to bottom, on the test SLURM cluster: its local cells,
then its SLURM cell (the cells assert the jobs succeeded and their results). Its path without
`sbatch` runs when the site is built (docs/notebook.py; tests/integration/test_site.py reads the
page)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.paths import REPO
from support.tiers import require_module, requires

pytestmark = [requires("torch"), pytest.mark.slow, pytest.mark.timeout(900)]


@requires("slurm")
def test_the_notebook_runs_headless_on_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow by nature: the notebook's kernel starts, and its cells submit and wait for real jobs."""
    nbformat = require_module("nbformat", "pip install 'dist-jobs[dev]' (nbclient, ipykernel)")
    nbclient = require_module("nbclient", "pip install 'dist-jobs[dev]' (nbclient, ipykernel)")
    require_module("ipykernel", "pip install 'dist-jobs[dev]' (nbclient, ipykernel)")
    monkeypatch.setenv("DIST_JOBS_NOTEBOOK_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(REPO / "examples" / "notebook.ipynb", as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=700, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = "".join(
        out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "local://" in printed and "succeeded (COMPLETED)" in printed
    assert "failed as expected: failed rank 1 exit 3" in printed  # result() of a failed job raised JobFailed
    assert "slurm://" in printed and "(best)" in printed, printed
    assert (tmp_path / "checkpoints" / "notebook-local" / "result.json").is_file()
