"""Never the same bad node twice, on Kubernetes: the job's pod templates keep its quarantined
nodes away, through a required node affinity.

The training operator recreates a pod that exited 128-255 from the job's current template, and the
scheduler places it anew. So the pod whose node the verdict blamed (dist_jobs.rundir.quarantine)
patches its own PyTorchJob before it exits: every replica template gets a requirement
`matchFields: metadata.name NotIn [nodes]` (a node's name, as the downward API gives
`spec.nodeName`, not a label a node may lack), added to each of the user's own required terms,
which stay as they were (terms are ORed, a term's requirements ANDed). The list is the job's whole
exclusion from now on (quarantine.exclusion): an expired quarantine leaves it at the next patch.

The pod talks to the apiserver as any in-cluster client does: the service account token, CA and
namespace the kubelet mounts, and KUBERNETES_SERVICE_HOST/PORT. The rendered manifest gives the
pods a ServiceAccount whose Role may get and patch this one job (render.k8s). A JSON merge patch
carrying the resourceVersion read fails with 409 when the job changed meanwhile (another pod's
patch): it is read and patched again. Stdlib only: it runs in the pod entrypoint, in any image.
"""

from __future__ import annotations

import copy
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_jobs.rundir.quarantine import Quarantine, exclusion

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NODE_FIELD = "metadata.name"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ANSWER_S = 10.0  # one GET or PATCH; the pod's verdict waits for it before the pod exits
CONFLICTS = 5  # patches lost to another pod's patch before giving up


def kept_off(pod_spec: Mapping[str, Any]) -> list[str]:
    """The nodes a pod template's required node affinity refuses by name (NotIn on metadata.name)."""
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED) or {}).get(
        "nodeSelectorTerms"
    ) or []
    found: list[str] = []
    for term in terms:
        for req in term.get("matchFields") or []:
            if _refusal(req):
                found += [str(v) for v in req.get("values") or []]
    return list(dict.fromkeys(found))


def avoiding(pod_spec: Mapping[str, Any], nodes: list[str]) -> dict[str, Any]:
    """The template's `affinity` refusing exactly `nodes` by name (none: the refusal removed), the
    user's own terms and other affinities kept."""
    affinity = copy.deepcopy(dict(pod_spec.get("affinity") or {}))
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault(REQUIRED, {})
    terms = required.get("nodeSelectorTerms") or [{}]
    refusal = [{"key": NODE_FIELD, "operator": "NotIn", "values": nodes}] if nodes else []
    for term in terms:
        fields = [r for r in term.get("matchFields") or [] if not _refusal(r)] + refusal
        term.pop("matchFields", None)
        if fields:
            term["matchFields"] = fields
    terms = [t for t in terms if t]
    if terms:
        required["nodeSelectorTerms"] = terms
    else:  # nothing was required but the refusal, now gone
        node_affinity.pop(REQUIRED)
    if not node_affinity:
        affinity.pop("nodeAffinity")
    return affinity


def _refusal(req: Mapping[str, Any]) -> bool:
    return req.get("key") == NODE_FIELD and req.get("operator") == "NotIn"


class ApiError(Exception):
    """The apiserver refused or did not answer; `status` is its HTTP code (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class InCluster:
    """The apiserver as a pod reaches it: the mounted service account and the kubernetes Service."""

    url: str
    folder: Path  # the service account's mount (token, ca.crt, namespace)

    @classmethod
    def detect(cls, environ: Mapping[str, str], folder: Path | None = None) -> InCluster | None:
        folder = SERVICE_ACCOUNT if folder is None else folder
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port or not (folder / "token").is_file():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", folder)

    @property
    def namespace(self) -> str:
        return (self.folder / "namespace").read_text().strip()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        # The token is read at every call: the kubelet rotates a projected token in place.
        headers = {
            "Authorization": f"Bearer {(self.folder / 'token').read_text().strip()}",
            "Accept": "application/json",
        }
        data = None if body is None else json.dumps(body).encode()
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        https = self.url.startswith("https:")
        context = ssl.create_default_context(cafile=str(self.folder / "ca.crt")) if https else None
        try:
            with urllib.request.urlopen(request, timeout=ANSWER_S, context=context) as answer:
                return dict(json.loads(answer.read()))
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                text = str(json.loads(text).get("message") or text)
            except ValueError:
                pass
            raise ApiError(exc.code, f"{method} {path}: {exc.code} {text.strip()}") from None
        except (OSError, ValueError) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from None


def job_path(namespace: str, name: str) -> str:
    return f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}"


def keep_nodes_off(api: InCluster, job: str, records: Iterable[Quarantine], now: float) -> list[str]:
    """Patch PyTorchJob `job` so that its pods refuse the actively quarantined nodes (and no longer
    those whose quarantine expired); the nodes refused from now on. Raises ApiError."""
    records = list(records)
    path = job_path(api.namespace, job)
    for _ in range(CONFLICTS):
        obj = api.call("GET", path)
        replicas = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        current = [n for r in replicas.values() for n in kept_off(r["template"].get("spec") or {})]
        nodes = exclusion(current, records, now)
        patch = {
            rtype: {"template": {"spec": {"affinity": avoiding(r["template"].get("spec") or {}, nodes)}}}
            for rtype, r in replicas.items()
        }
        body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}}
        try:
            api.call("PATCH", path, {**body, "spec": {"pytorchReplicaSpecs": patch}})
        except ApiError as exc:
            if exc.status == 409:  # another pod's patch came first: read it and patch again
                continue
            raise
        return nodes
    raise ApiError(409, f"PATCH {path}: the job kept changing ({CONFLICTS} conflicts)")


def from_env(environ: Mapping[str, str] = os.environ) -> tuple[InCluster | None, str]:
    """The in-cluster apiserver and this pod's PyTorchJob (DIST_JOBS_K8S_JOB, set by render.k8s)."""
    return InCluster.detect(environ), environ.get("DIST_JOBS_K8S_JOB", "").strip()
