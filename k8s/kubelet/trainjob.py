"""The controller's TrainJob part: Kubeflow Trainer v2 (v2.3.0) with its torch plugin, and the
JobSet and Job controllers under it, as far as a TrainJob of dist-jobs needs them
(KUBERNETES_NOTES section 5, items 7 and 8).

The trainer turns a TrainJob into a JobSet whose replicated Job `node` is an Indexed Job of
numNodes pods; the Job controller makes pods named `<trainjob>-node-0-<index>-<5 random>`, with
the completion index as annotation and label, hostname `<trainjob>-node-0-<index>` and subdomain
`<trainjob>` (the JobSet's headless Service). The torch plugin adds to the `node` container
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (from the completion index annotation),
PET_MASTER_ADDR=<trainjob>-node-0-0.<trainjob> and PET_MASTER_PORT=29500. The pod template is
the runtime's (torch-distributed: one container `node`) with the TrainJob's `runtimePatches`
and `trainer` (image, command, args, env, resourcesPerNode) applied.

Here the pods are made directly (no JobSet or Job objects: this apiserver runs no controller for
them), owned by the TrainJob. Cluster DNS is stood in for by hostAliases: the master name
`<trainjob>-node-0-0.<trainjob>` is the index-0 pod's address on the other pods (created once it
has one) and 127.0.0.1 on the index-0 pod itself (its own address is not known before it exists).
The pods' restartPolicy is the Job's OnFailure: the kubelet restarts a failed container in place,
and past the Job's backoffLimit (6) the TrainJob fails; it is Complete when every pod succeeded.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

TRAINER = "/apis/trainer.kubeflow.org/v1alpha1"
JOBSET = "jobset.sigs.k8s.io/"
INDEX = "batch.kubernetes.io/job-completion-index"
STEP = "node"  # the torch runtime's replicatedJob and container
MASTER_PORT = "29500"
BACKOFF_LIMIT = 6  # batch/v1 Job's default: the torch runtime sets none


def path(namespace: str, name: str = "") -> str:
    return f"{TRAINER}/namespaces/{namespace}/trainjobs" + (f"/{name}" if name else "")


def index_of(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(INDEX)
    return int(value) if str(value).isdigit() else None


def patched_template(tj: dict[str, Any]) -> dict[str, Any]:
    """The `node` pod template after the TrainJob's runtimePatches (metadata and spec)."""
    template: dict[str, Any] = {"metadata": {}, "spec": {"containers": [{"name": STEP}]}}
    for patch in tj["spec"].get("runtimePatches") or []:
        jobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
            "replicatedJobs"
        ) or []
        for job in jobs:
            if job.get("name") != STEP:
                continue
            pod = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
            meta = pod.get("metadata") or {}
            for key in ("labels", "annotations"):
                template["metadata"].setdefault(key, {}).update(meta.get(key) or {})
            spec = copy.deepcopy(pod.get("spec") or {})
            patched = {c.get("name"): c for c in spec.pop("containers", [])}
            template["spec"].update(spec)
            template["spec"]["containers"][0].update(patched.get(STEP) or {})
    return template


def plugin_env(tj: dict[str, Any]) -> list[dict[str, Any]]:
    name, trainer = tj["metadata"]["name"], tj["spec"].get("trainer") or {}
    return [
        {"name": "PET_NNODES", "value": str(trainer.get("numNodes", 1))},
        {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode", "auto"))},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}},
        {"name": "PET_MASTER_ADDR", "value": master_name(name)},
        {"name": "PET_MASTER_PORT", "value": MASTER_PORT},
    ]


def master_name(name: str) -> str:
    return f"{name}-{STEP}-0-0.{name}"


def pod_body(tj: dict[str, Any], index: int, node: str, master_ip: str) -> dict[str, Any]:
    """Pod `index` of the TrainJob as the Job controller would create it (before admission)."""
    name, trainer = tj["metadata"]["name"], tj["spec"].get("trainer") or {}
    template = patched_template(tj)
    container = template["spec"]["containers"][0]
    for key in ("image", "command", "args"):
        if key in trainer:
            container[key] = copy.deepcopy(trainer[key])
    container["env"] = [*copy.deepcopy(trainer.get("env") or []), *plugin_env(tj)]
    if trainer.get("resourcesPerNode"):
        container["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
    spec = template["spec"]
    spec.setdefault("restartPolicy", "OnFailure")
    spec.update(hostname=f"{name}-{STEP}-0-{index}", subdomain=name, nodeName=node)
    spec["hostAliases"] = [{"ip": master_ip, "hostnames": [master_name(name)]}]
    labels = {
        **template["metadata"].get("labels", {}),
        f"{JOBSET}jobset-name": name,
        f"{JOBSET}replicatedjob-name": STEP,
        f"{JOBSET}job-index": "0",
        "job-name": f"{name}-{STEP}-0",
        INDEX: str(index),
    }
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name}
    metadata = {
        "name": f"{name}-{STEP}-0-{index}-{uuid.uuid4().hex[:5]}",
        "labels": labels,
        "annotations": {**template["metadata"].get("annotations", {}), INDEX: str(index)},
        "ownerReferences": [{**owner, "uid": tj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def judged(tj: dict[str, Any], pods: dict[int, dict[str, Any]]) -> tuple[str | None, str]:
    """('Complete' | 'Failed' | None, message) from the pods' phases and in-place restarts."""
    name, count = tj["metadata"]["name"], int((tj["spec"].get("trainer") or {}).get("numNodes", 1))
    for index, pod in sorted(pods.items()):
        restarts = sum(int(s.get("restartCount", 0)) for s in pod["status"].get("containerStatuses") or [])
        if pod["status"].get("phase") == "Failed" or restarts > BACKOFF_LIMIT:
            return "Failed", f"TrainJob {name}: node {index} failed ({restarts} restarts; Job backoffLimit reached)"
    if len(pods) == count and all(p["status"].get("phase") == "Succeeded" for p in pods.values()):
        return "Complete", f"TrainJob {name} is completed"
    return None, ""


def jobs_status(tj: dict[str, Any], pods: dict[int, dict[str, Any]], ended: str | None) -> list[dict[str, Any]]:
    """The one child Job `node`: active while a pod runs; succeeded or failed once it has."""
    phases = [p["status"].get("phase") for p in pods.values()]
    active = int(ended is None and any(ph in ("Pending", "Running") for ph in phases))
    ready = int(
        bool(pods)
        and all(
            all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])
            or p["status"].get("phase") == "Succeeded"
            for p in pods.values()
        )
    )
    return [
        {
            "name": STEP,
            "active": active,
            "ready": ready,
            "succeeded": int(ended == "Complete"),
            "failed": int(ended == "Failed"),
            "suspended": 0,
        }
    ]
