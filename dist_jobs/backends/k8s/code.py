"""`snapshot: true` on Kubernetes: the code as submitted, in a ConfigMap the job owns.

The image is normally the user's code; a snapshot adds the code of the submitting folder, chosen
as every snapshot is (dist_jobs.backends.snapshot: git-tracked and unignored files as on disk, or
the folder minus data and checkpoints), as a gzipped tar in the ConfigMap `<job>-code`. The pods
mount it read-only and their entrypoint unpacks it into a folder of the pod (render.k8s), so every
start of every replica runs the same code. `prepare` (the dry run) appends it to the job's
manifest as a second YAML document; `submit` creates the job first and then the ConfigMap with an
ownerReference to the job (its uid exists only once the job does), so deleting the job lets the
garbage collector remove the ConfigMap, and no failed submit leaves one behind that nothing owns.
Pods that start before the ConfigMap exists wait for their volume (the kubelet retries the mount).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import yaml

from dist_jobs.backends.snapshot import RECORD, describe, listing
from dist_jobs.errors import UsageError
from dist_jobs.render.k8s import CODE_DIR, SNAPSHOT_KEY, snapshot_configmap
from dist_jobs.spec import JobSpec
from dist_jobs.spec.k8s_names import k8s_name

# The apiserver refuses a ConfigMap whose data are more than 1 MiB (core validation's MaxSize).
CONFIGMAP_LIMIT = 1024 * 1024
# What may be read and compressed at all: far more than compresses under the limit.
RAW_LIMIT = 64 * 1024 * 1024


def with_code(spec: JobSpec, payload: str, source: Path) -> str:
    """The job's manifest `payload` followed by the ConfigMap holding the code in `source`."""
    blob, record = pack(source)
    meta: dict[str, Any] = {
        "name": snapshot_configmap(spec),
        "labels": {"app.kubernetes.io/managed-by": "dist-jobs", "dist-jobs/run": k8s_name(spec)},
        "annotations": {
            "dist-jobs/source": record["source"],
            "dist-jobs/commit": record["commit"] or "",
            "dist-jobs/dirty": "" if record["dirty"] is None else str(record["dirty"]).lower(),
        },
    }
    if spec.k8s.namespace:
        meta["namespace"] = spec.k8s.namespace
    doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    doc["binaryData"] = {SNAPSHOT_KEY: base64.b64encode(blob).decode()}
    return payload.rstrip("\n") + "\n---\n" + yaml.safe_dump(doc, sort_keys=False, width=1 << 30)


def pack(source: Path) -> tuple[bytes, dict[str, Any]]:
    """The code in `source` as a gzipped tar (SNAPSHOT.json inside records the commit and whether
    the tree was dirty) and that record; more than a ConfigMap holds raises a UsageError."""
    source = source.resolve()
    files, commit, dirty, size = listing(source, [], RAW_LIMIT)
    record = {"dir": CODE_DIR, "source": str(source), "commit": commit, "dirty": dirty, "files": len(files)}
    record["bytes"] = size
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for rel in files:
            tar.add(source / rel, arcname=rel, recursive=False)
        data = (json.dumps(record, indent=2) + "\n").encode()
        info = tarfile.TarInfo(RECORD)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    blob = out.getvalue()
    if len(blob) > CONFIGMAP_LIMIT:
        raise UsageError(
            f"snapshot: the code in {source} is {len(blob) / 2**20:.1f} MiB compressed ({len(files)} files), "
            f"more than the {CONFIGMAP_LIMIT / 2**20:.0f} MiB a Kubernetes ConfigMap holds",
            "build an image with the code (image:) and submit without a snapshot (snapshot: false), or exclude "
            "folders from it (.gitignore; without git, move data and checkpoints out of the code folder)",
        )
    return blob, record


def split(payload: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The job and, with a snapshot, its ConfigMap, from a prepared payload."""
    job, *rest = companions(payload)
    return job, next((d for d in rest if d.get("kind") == "ConfigMap"), None)


def companions(payload: str) -> list[dict[str, Any]]:
    """Every object of a prepared payload: the job first, then what it owns once created (the
    snapshot's ConfigMap, its pods' ServiceAccount, Role and RoleBinding)."""
    return [d for d in yaml.safe_load_all(payload) if d]


def owned(obj: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """`obj` owned by the created `job`: deleting the job deletes it (garbage collection)."""
    meta = job["metadata"]
    owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"], "uid": meta["uid"]}
    out = {**obj, "metadata": {**obj["metadata"], "namespace": meta["namespace"]}}
    out["metadata"]["ownerReferences"] = [owner]
    return out


CODE_ANNOTATION = "dist-jobs/code"  # on the job: what `status` shows as its code


def annotated(job: dict[str, Any], payload: str) -> dict[str, Any]:
    """The job `job` to create, naming the snapshot it runs (commit, uncommitted changes) for status."""
    code = split(payload)[1]
    if code is None:
        return job
    notes = code["metadata"]["annotations"]
    record = {"commit": notes.get("dist-jobs/commit"), "dirty": notes.get("dist-jobs/dirty") == "true"}
    record["dir"] = f"ConfigMap {code['metadata']['name']}"
    job["metadata"].setdefault("annotations", {})[CODE_ANNOTATION] = describe(record)
    return job


def code_line(job: dict[str, Any]) -> str | None:
    """What `annotated` recorded on a created job; None for a job without a snapshot."""
    found = ((job.get("metadata") or {}).get("annotations") or {}).get(CODE_ANNOTATION)
    return found if isinstance(found, str) else None
