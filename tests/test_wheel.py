"""A non-editable `pip install .` into a fresh virtual environment renders with the shipped templates."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_wheel_install_renders(tmp_path) -> None:
    src = tmp_path / "src"
    # A copy without the checkout's templates next to the install: only the wheel's own may be used.
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "*.pyc", "__pycache__",
                                                            ".hypothesis", ".pytest_cache", "dist-jobs-runs"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    proc = subprocess.run([*pip, str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(src)  # the installed package must not lean on the source tree
    example = tmp_path / "job.yaml"
    example.write_text((REPO / "slurm/examples/cpu-only.yaml").read_text())
    for backend, marker in (("slurm", "#SBATCH --nodes=2"), ("k8s", "kind: PyTorchJob")):
        out = subprocess.run([str(venv / "bin" / "dist-jobs"), "render", "--backend", backend, str(example)],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert out.returncode == 0, out.stderr
        assert marker in out.stdout
    files = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import dist_jobs.render as r; print(r.template_dir())"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert "site-packages" in files
