"""examples/notebook.ipynb runs headless on the test SLURM cluster: its set-up cell, then its SLURM
section (the cell asserts the job succeeded and its result). Its local sections run, whole, when
the site is built (docs/notebook.py, without `sbatch`; tests/integration/test_site.py reads what
each cell printed), so the cluster's lane does not run them a second time."""

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
    notebook.cells = slurm_part(notebook.cells)
    nbclient.NotebookClient(
        notebook, timeout=700, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = "".join(
        out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "slurm://" in printed and "succeeded (COMPLETED)" in printed, printed
    assert "no sbatch here" not in printed, printed
    assert (tmp_path / "checkpoints" / "notebook-slurm" / "result.json").is_file()


def slurm_part(cells: list) -> list:
    """The cells before the first section (the imports and the job_spec() every section uses) and
    the SLURM section's."""
    headings = [i for i, cell in enumerate(cells) if cell.cell_type == "markdown" and cell.source.startswith("## ")]
    slurm = next(i for i in headings if cells[i].source.startswith("## SLURM"))
    return cells[: headings[0]] + cells[slurm:]
