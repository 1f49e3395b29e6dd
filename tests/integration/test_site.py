"""The documentation site as a reader opens it: built with `mkdocs build --strict` (its executed
examples and tutorials run, so a stale page fails here), then opened from disk (file://, no web
server) in headless Chromium, whose DOM after the page's scripts ran is what is checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from support.paths import REPO
from support.tiers import require_tool, requires
from support.waiting import HUNG_S

# The tutorials train (torch); the build takes a while on 2 cores, and several times as long on a
# loaded one (the suite's default limit, pyproject's, covers it). One worker: the module's tests
# share one build (`site`), which a second worker would redo.
pytestmark = [requires("torch"), pytest.mark.slow, pytest.mark.xdist_group("test_site")]
BUILD_S = 800  # a guard against a hung build, not a measure; inside the limit of the test that builds it

# Chromium as a probe on a closed network: no first-run work, no background connections.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",
    "--virtual-time-budget=5000",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it, once for the module (one xdist group): slow by nature, the
    build runs every page's examples (real local runs of the tutorials' jobs)."""
    folder = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    built = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=BUILD_S,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return folder


def dom(page: Path, profile: Path) -> str:
    chromium = require_tool("chromium")
    shown = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=HUNG_S,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    return shown.stdout


def local_links(html: str, page: Path) -> set[Path]:
    """The files this page's links open, resolved as the browser resolves them from disk."""
    found = set()
    for href in re.findall(r'<a [^>]*href="([^"#?]*)[^"]*"', html):
        if not href or urlparse(href).scheme:
            continue
        found.add((page.parent / unquote(href)).resolve())
    return found


def test_every_link_opened_from_disk_lands_on_a_page(site: Path, tmp_path: Path) -> None:
    index = site / "index.html"
    html = dom(index, tmp_path)
    links = local_links(html, index)
    # The navigation reaches every section, and every link opens a file (no folder listings).
    pages = ["getting-started", "first-run", "your-script", "notebook", "fsdp", "examples", "spec", "api"]
    assert {f"{page}.html" for page in pages} <= {link.name for link in links}
    assert [link for link in links if not link.is_file()] == []
    # The search box is there, and its index is a script (a fetch() of JSON fails from file://).
    assert 'data-md-component="search-query"' in html
    assert (site / "search" / "search_index.js").is_file()


def test_the_tutorial_shows_its_real_output_and_its_picture(site: Path, tmp_path: Path) -> None:
    html = dom(site / "tutorials" / "first-run.html", tmp_path)
    text = re.sub(r"<[^>]+>", "", html)
    assert "local:///home/me/tutorial/checkpoints/first-run" in text
    assert re.search(r"\d\d:\d\d:\d\d INFO step 10/60 epoch 0 train: loss \d", text)
    assert "\u2026" not in text  # every elided line shows what was printed
    image = re.search(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]{1000,})"', html)
    assert image is not None, "the run's plot is not embedded"


def test_the_examples_gallery_ran_each_example(site: Path, tmp_path: Path) -> None:
    text = re.sub(r"<[^>]+>", "", dom(site / "examples.html", tmp_path))
    assert re.search(r"\[rank 0\] eval_loss \d+\.\d{4}, eval_mae \d+\.\d{4}", text)  # fit-your-model's last line
    assert "dist.init_process_group" in text  # ddp-script's train.py, shown from its folder
    your_script = re.sub(r"<[^>]+>", "", dom(site / "tutorials" / "your-script.html", tmp_path))
    assert "[rank 0] done on 4 ranks; LOCAL_RANK 0, MASTER_ADDR 127.0.0.1" in your_script


def test_the_notebook_tutorial_shows_each_cells_output_from_a_run_at_build_time(site: Path, tmp_path: Path) -> None:
    """examples/notebook.ipynb ran while the site was built, without sbatch (its local path; the
    SLURM path runs in tests/integration/test_notebook.py): each cell's own output is on the page."""
    text = re.sub(r"<[^>]+>", "", dom(site / "tutorials" / "notebook.html", tmp_path))
    assert "local:///home/me/tutorial/checkpoints/notebook-local" in text
    assert "succeeded (COMPLETED)" in text, text[-3000:]
    attached = r"/checkpoints/notebook-local succeeded \(COMPLETED\) exit 0\s+goodput \d+% \(no fault\)"
    assert re.search(attached, text), text[-3000:]  # the job found again by its handle, with its ledger
    assert "failed as expected: failed rank 1 exit 3" in text  # result() of the failed job raised JobFailed
    assert re.search(r"notebook-sweep\S* \{'train.lr': 0.05\}", text), text[-3000:]
    assert "(best)" in text and "no sbatch here: SLURM part skipped" in text


def test_the_fsdp_tutorial_resumed_on_another_world_size_and_exported(site: Path, tmp_path: Path) -> None:
    text = re.sub(r"<[^>]+>", "", dom(site / "tutorials" / "fsdp.html", tmp_path))
    assert "it was written by 2 ranks at sample 640 of the epoch; 4 ranks x batch 16 continue at sample 640" in text
    assert "exported the model of /home/me/tutorial/checkpoints/sharded/step-30 to model.pt" in text


def test_the_slurm_cluster_tutorial_renders_its_batch_script_now_and_shows_its_captured_run(
    site: Path, tmp_path: Path
) -> None:
    """The build never submits to a cluster: the session on the page is a capture, said so in a
    note, and the batch script beside it is rendered by this build (a stale one fails --strict)."""
    html = dom(site / "tutorials" / "slurm-cluster.html", tmp_path)
    text = re.sub(r"<[^>]+>", "", html)
    assert "Captured once, not run at each build" in text
    assert "# Generated by dist-jobs" in text and "#SBATCH --job-name=first-slurm" in text
    assert "resumed from /home/me/tutorial/checkpoints/first-slurm/step-168" in text
    assert '"cause": "a cancel or a requeue from outside"' in text.replace("&quot;", '"')
    assert re.search(r'<img [^>]*src="[^"]*slurm-cluster-run\.png"', html), "the captured run's plot is missing"
    assert (site / "tutorials" / "slurm-cluster-run.png").is_file()
