"""`dist-jobs render` stays fast: the render side imports no torch, kubernetes or submitit."""

from __future__ import annotations

import json
import subprocess

from support.layers import modules
from support.paths import PYTHON, REPO

HEAVY = ("torch", "torchvision", "kubernetes", "submitit", "jsonschema", "numpy", "pydantic")

PROBE = """
import json, sys, io, contextlib
from dist_jobs.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(["render", "--backend", BACKEND, EXAMPLE])
print(json.dumps({"rc": rc, "mods": sorted(m.split(".")[0] for m in sys.modules), "out": len(buf.getvalue())}))
"""


def _probe(backend: str, example: str) -> dict:
    code = PROBE.replace("BACKEND", repr(backend)).replace("EXAMPLE", repr(str(REPO / example)))
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_render_slurm_imports_nothing_heavy() -> None:
    got = _probe("slurm", "slurm/examples/resnet-2x4.yaml")
    assert got["rc"] == 0 and got["out"] > 0
    assert not set(HEAVY) & set(got["mods"]), set(HEAVY) & set(got["mods"])


def test_render_k8s_imports_nothing_heavy() -> None:
    got = _probe("k8s", "k8s/examples/resnet-2x4.yaml")
    assert got["rc"] == 0 and got["out"] > 0
    assert not set(HEAVY) & set(got["mods"]), set(HEAVY) & set(got["mods"])


def test_every_render_side_module_imports_light() -> None:
    # Every module outside the runtime side (dist_jobs.train's submodules), found on disk, so a new
    # module is covered the day it is added.
    render_side = [m for m in modules() if not m.startswith("dist_jobs.train.") and not m.endswith("__main__")]
    assert "dist_jobs.backends.k8s" in render_side and "dist_jobs.cli.commands" in render_side
    code = (
        "import importlib, json, sys\n"
        f"for m in {render_side!r}:\n    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    mods = json.loads(proc.stdout)
    assert not set(HEAVY) & set(mods), set(HEAVY) & set(mods)
