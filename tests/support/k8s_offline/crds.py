"""The vendored CustomResourceDefinitions: where they are and the names a client needs.

Test-only: the CRDs live in the checkout's k8s/crds and are not shipped in the wheel. yaml is
imported only when a CRD is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dist_jobs.errors import DistJobsError, UsageError

__all__ = ["CRD_DIRS", "CRD_FILES", "CrdInfo", "crd_doc", "crd_info", "crd_path"]

CRD_DIRS: tuple[Path, ...] = (Path(__file__).resolve().parents[3] / "k8s" / "crds",)
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
}


@dataclass(frozen=True)
class CrdInfo:
    """Names a client needs to address a CRD's objects (CustomObjectsApi arguments)."""

    path: Path
    group: str
    kind: str
    plural: str
    singular: str
    list_kind: str
    namespaced: bool
    versions: tuple[str, ...]
    storage_version: str

    def api_version(self, version: str | None = None) -> str:
        return f"{self.group}/{version or self.storage_version}"


def crd_path(kind: str) -> Path:
    """The vendored CRD file for `kind` (PyTorchJob, TrainJob or JobSet) in the checkout."""
    name = CRD_FILES.get(kind)
    if name is None:
        raise UsageError(
            f"kind {kind!r} has no vendored CRD",
            hint=f"use one of {', '.join(CRD_FILES)} or pass crd=<path to a CRD YAML>",
        )
    for folder in CRD_DIRS:
        if (folder / name).is_file():
            return folder / name
    searched = ", ".join(str(folder) for folder in CRD_DIRS)
    raise DistJobsError(
        f"the vendored CRD for {kind} ({name}) is missing: looked in {searched}",
        hint="run from a full checkout (k8s/crds is test data, not shipped in the wheel), "
        "or pass crd=<path to a CRD YAML>",
    )


@lru_cache(maxsize=8)
def crd_doc(path: str) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=loader)
    except (OSError, yaml.YAMLError) as exc:
        raise DistJobsError(f"cannot read CRD {path}: {exc}", hint="pass a readable CRD YAML") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
        raise DistJobsError(f"{path} is not a CustomResourceDefinition", hint="pass a CRD YAML file")
    return doc


@lru_cache(maxsize=16)
def crd_info(crd: Path) -> CrdInfo:
    """Group, kind, plural and versions of the CRD at `crd` (parsed once per path)."""
    path = Path(crd).resolve()
    spec = crd_doc(str(path))["spec"]
    names = spec["names"]
    versions = tuple(v["name"] for v in spec["versions"] if v.get("served", True))
    storage = next((v["name"] for v in spec["versions"] if v.get("storage")), versions[0])
    return CrdInfo(
        path=path,
        group=spec["group"],
        kind=names["kind"],
        plural=names["plural"],
        singular=names.get("singular", names["kind"].lower()),
        list_kind=names.get("listKind", names["kind"] + "List"),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        versions=versions,
        storage_version=storage,
    )
