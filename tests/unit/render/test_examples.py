"""Checked-in rendered examples stay identical to what the templates produce.

Refresh after changing a template or an example spec:
    DIST_JOBS_REFRESH_EXAMPLES=1 python -m pytest tests/unit/render/test_examples.py   (or: make examples)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dist_jobs.render import render
from dist_jobs.render.k8s import access_manifest
from dist_jobs.spec.load import load_spec
from support.paths import REPO

CASES = [(spec, "slurm", spec.with_suffix(".sbatch")) for spec in sorted((REPO / "slurm" / "examples").glob("*.yaml"))]
K8S_SPECS = [
    s
    for s in sorted((REPO / "k8s" / "examples").glob("*.yaml"))
    if not s.name.endswith((".pytorchjob.yaml", ".trainjob.yaml"))
]
CASES += [
    (
        spec,
        "k8s",
        spec.with_name(spec.stem + (".trainjob.yaml" if "api: trainjob" in spec.read_text() else ".pytorchjob.yaml")),
    )
    for spec in K8S_SPECS
]
REFRESH = "DIST_JOBS_REFRESH_EXAMPLES=1 python -m pytest tests/unit/render/test_examples.py (or: make examples)"


@pytest.mark.parametrize("spec_path,backend,rendered", CASES, ids=[f"{c[1]}:{c[0].name}" for c in CASES])
def test_rendered_example_is_current(spec_path: Path, backend: str, rendered: Path) -> None:
    spec = load_spec(spec_path)
    text = render(spec, backend)  # type: ignore[arg-type]
    if backend == "k8s":  # what `dist-jobs render` prints: the pods' account, Role and RoleBinding follow
        text += access_manifest(spec)
    if os.environ.get("DIST_JOBS_REFRESH_EXAMPLES"):
        rendered.write_text(text)
    assert rendered.exists(), f"{rendered.relative_to(REPO)} is missing; create it with: {REFRESH}"
    assert rendered.read_text() == text, (
        f"{rendered.relative_to(REPO)} differs from what the templates render now; refresh with: {REFRESH}"
    )


def test_every_example_kind_is_present() -> None:
    names = {c[0].name for c in CASES}
    assert {"resnet-2x4.yaml", "cpu-only.yaml", "torchrun.yaml", "elastic.yaml"} <= names
