"""A non-editable `pip install .` into a fresh virtual environment renders with the shipped templates."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.paths import REPO
from support.waiting import HUNG_S


@pytest.mark.slow
def test_wheel_install_renders(tmp_path) -> None:
    """Slow by nature: pip builds the wheel in an isolated build environment and installs it with
    its dependencies into a new virtual environment, as a user's `pip install` does."""
    src = tmp_path / "src"
    # A copy without the checkout's templates next to the install: only the wheel's own may be used.
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".nox", ".git", "build", "*.pyc", "__pycache__", ".hypothesis", ".pytest_cache", "dist-jobs-runs"
        ),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp_path / "wheel"), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("dist_jobs-*.whl")
    _check_wheel_contents(wheel)
    proc = subprocess.run([*pip, "install", str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(src)  # the installed package must not lean on the source tree
    example = tmp_path / "job.yaml"
    example.write_text((REPO / "slurm/examples/cpu-only.yaml").read_text())
    for backend, marker in (("slurm", "#SBATCH --nodes=2"), ("k8s", "kind: PyTorchJob")):
        out = subprocess.run(
            [str(venv / "bin" / "dist-jobs"), "render", "--backend", backend, str(example)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=HUNG_S,
        )
        assert out.returncode == 0, out.stderr
        assert marker in out.stdout
    files = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import dist_jobs.render.common as r; print(r.template_dir())"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    assert "site-packages" in files


def _check_wheel_contents(wheel: Path) -> None:
    """The wheel ships the package, its templates and py.typed; no test code, no CRD, no checkout."""
    names = zipfile.ZipFile(wheel).namelist()
    shipped = [n for n in names if not n.startswith("dist_jobs-")]  # the .dist-info folder aside
    assert all(n.startswith("dist_jobs/") for n in shipped), [n for n in shipped if not n.startswith("dist_jobs/")]
    assert "dist_jobs/py.typed" in names and "dist_jobs/templates/sbatch.sh.j2" in names
    test_only = [n for n in shipped if re.search(r"(^|/)(tests?|support|crds|k8s_offline)(/|$)|\.yaml$|/test_", n)]
    assert not test_only, test_only
