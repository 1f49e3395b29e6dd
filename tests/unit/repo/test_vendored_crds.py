"""The vendored CRDs in k8s/crds/ are the unmodified upstream files SOURCES.md names."""

from __future__ import annotations

import hashlib
import re

import pytest

from support.paths import REPO

CRDS = REPO / "k8s" / "crds"
_ROW = re.compile(r"^\|\s*(?P<file>[\w.-]+\.yaml)\s*\|.*\|\s*(?P<sha>[0-9a-f]{64})\s*\|\s*$")


def _recorded() -> dict[str, str]:
    rows = (_ROW.match(line) for line in (CRDS / "SOURCES.md").read_text(encoding="utf-8").splitlines())
    return {m["file"]: m["sha"] for m in rows if m}


def test_sources_md_lists_every_vendored_crd_and_nothing_else() -> None:
    recorded = _recorded()
    assert len(recorded) == 3, recorded
    assert set(recorded) == {p.name for p in CRDS.glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(_recorded()))
def test_vendored_crd_matches_recorded_sha256(name: str) -> None:
    digest = hashlib.sha256((CRDS / name).read_bytes()).hexdigest()
    assert digest == _recorded()[name], f"k8s/crds/{name} differs from the upstream file SOURCES.md pins"


@pytest.mark.parametrize(
    ("kind", "group", "version"),
    [
        ("PyTorchJob", "kubeflow.org", "v1"),
        ("TrainJob", "trainer.kubeflow.org", "v1alpha1"),
        ("JobSet", "jobset.x-k8s.io", "v1alpha2"),
    ],
)
def test_crd_path_resolves_each_kind_to_its_vendored_crd(kind: str, group: str, version: str) -> None:
    from support.k8s_offline.validate import crd_info, crd_path

    path = crd_path(kind)
    assert path.parent == CRDS
    info = crd_info(path)
    assert (info.kind, info.group, info.storage_version, info.namespaced) == (kind, group, version, True)
