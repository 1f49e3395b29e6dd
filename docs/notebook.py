"""A notebook of the repository as a page, run at build time: `<!-- gen: notebook examples/notebook.ipynb -->`.

The notebook runs top to bottom in a kernel of the builder's python (nbclient, as
tests/integration/test_notebook.py runs it), in a scratch folder that the page shows as
gen.SHOWN_FOLDER. Its Markdown cells become the page's text, each code cell a Python block and
what it printed a text block under it: the page carries what the cells printed at build time,
not what someone pasted. A cell that raises fails the build. `sbatch` is kept off the kernel's
PATH, so the notebook takes its no-cluster path wherever the site is built (the SLURM cell says
it was skipped): a build never submits to a cluster.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gen


def notebook(relative: str) -> str:
    """The notebook `relative` (to the repository) as Markdown, with its cells' output from a run now."""
    # Here, not at the top: the torch-free test sessions import the docs' hooks without the notebook tools.
    import nbclient
    import nbformat

    book = nbformat.read(gen.REPO / relative, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        folder = os.path.realpath(scratch)
        with _kernel_env(folder):
            nbclient.NotebookClient(
                book, timeout=600, kernel_name="python3", resources={"metadata": {"path": folder}}
            ).execute()
        return "\n".join(_cell(cell, folder) for cell in book.cells)


def _cell(cell: Any, folder: str) -> str:
    if cell.cell_type == "markdown":
        return re.sub(r"\A# [^\n]*\n", "", cell.source) + "\n"  # the page has its own title
    if cell.cell_type != "code":
        return ""
    block = f"```python\n{cell.source.rstrip()}\n```\n"
    printed = "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    if printed.strip():
        block += "\n```text\n" + printed.replace(folder, gen.SHOWN_FOLDER).rstrip() + "\n```\n"
    return block


@contextmanager
def _kernel_env(folder: str) -> Iterator[None]:
    """The kernel's environment for the run: the scratch folder as DIST_JOBS_NOTEBOOK_DIR, the
    repository on PYTHONPATH (the ranks import dist-jobs from it), the builder's python first on
    PATH, and no `sbatch` on it."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not (Path(p) / "sbatch").exists()]
    given = {
        "DIST_JOBS_NOTEBOOK_DIR": folder,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(gen.REPO), os.environ.get("PYTHONPATH")])),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), *path]),
    }
    with gen.environ(given):
        yield
