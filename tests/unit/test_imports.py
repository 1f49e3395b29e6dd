"""`dist-jobs render` imports no torch, kubernetes or submitit; the SLURM query verbs not even the
renderer, yaml or the spec classes. Their start-up time is checked against its budget by
bench/bench_cli_verbs.py and bench/bench_render.py, not here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.layers import modules
from support.paths import PYTHON, REPO, TESTS
from support.tiers import requires
from support.waiting import HUNG_S

FIXTURES = TESTS / "fixtures" / "slurm"

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


# `dist-jobs status/list/cancel/logs --backend slurm` run a scheduler command and parse its
# output: no template engine, YAML or spec classes. Fake scheduler commands answer with output
# captured from the real cluster (tests/fixtures/slurm), so the probe needs no cluster.
LIGHT_VERB_HEAVY = (*HEAVY, "jinja2", "yaml", "msgspec")
FAKE_SLURM = {
    # --Format (capital F) is the long format, with the restart count.
    "squeue": 'case "$*" in *--Format*) long=_long;; esac; cat "$FIXTURES/squeue_format$long.txt"',
    "sacct": 'cat "$FIXTURES/sacct_running.txt"',
    "scancel": "exit 0",
}
QUERY_PROBE = """
import json, sys, io, contextlib
from dist_jobs.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(ARGV)
print(json.dumps({"rc": rc, "mods": sorted(sys.modules), "out": buf.getvalue()}))
"""


@pytest.mark.parametrize("verb", [["list"], ["status", "33"], ["cancel", "33"], ["logs", "33"]], ids=lambda v: v[0])
def test_slurm_query_verbs_import_no_renderer_yaml_or_spec(tmp_path: Path, verb: list[str]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "fx-33-attempt1-rank0.out").write_text("hello from rank 0\n")
    (tmp_path / "jobs" / "fx-33").mkdir(parents=True)
    job = {"log_dir": str(logs), "run": "fx", "launcher": "srun"}
    (tmp_path / "jobs" / "fx-33" / "job.json").write_text(json.dumps(job))
    argv = [*verb[:1], "--backend", "slurm", "--jobs-dir", str(tmp_path / "jobs"), *verb[1:]]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FIXTURES": str(FIXTURES)}
    code = QUERY_PROBE.replace("ARGV", repr(argv))
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["rc"] == 0 and got["out"].strip(), got["out"]
    assert "33" in got["out"] or "hello from rank 0" in got["out"], got["out"]
    heavy = {m for m in got["mods"] if m.split(".")[0] in LIGHT_VERB_HEAVY}
    assert not heavy, sorted(heavy)
    assert not [m for m in got["mods"] if m.startswith(("dist_jobs.render", "dist_jobs.spec.model"))]
    assert not [m for m in got["mods"] if "sweep" in m]  # a sweep's modules are for `sweep` alone


@requires("torch")
def test_the_trainer_is_one_import_and_importing_the_package_loads_no_torch() -> None:
    code = (
        "import sys, dist_jobs.train as t; from dist_jobs.train import TrainConfig; "
        "assert 'torch' not in sys.modules, 'torch'; "
        "from dist_jobs.train import fit; assert 'torch' in sys.modules; "
        "from dist_jobs.train.loop import fit as deep; assert fit is deep; "
        "from dist_jobs.spec.train import TrainConfig as C; assert TrainConfig is C; print('ok')"
    )
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=HUNG_S)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
