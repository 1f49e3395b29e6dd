"""The training operator's PyTorchJob validating webhook (kubeflow/trainer v1.9.x), offline.

`validator.pytorchjob.training-operator.kubeflow.org` checks what the CRD schema cannot: a
DNS-1035 name, only Master/Worker replicas, a container named `pytorch` with an image, Master
replicas exactly 1. The apiserver turns a denial into 403 Forbidden (KUBERNETES_NOTES section 1).
"""

from __future__ import annotations

from typing import Any

from support.k8s_offline.fielderrors import (
    DNS1035_LABEL,
    FieldError,
    forbidden,
    invalid,
    not_supported,
    required,
    syntax,
)

__all__ = ["WEBHOOK_NAME", "admission_errors"]

WEBHOOK_NAME = "validator.pytorchjob.training-operator.kubeflow.org"
_MANAGED_BY = ["kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"]
_REPLICA_TYPES = ["Master", "Worker"]


def _replica_errors(rtype: str, rspec: Any) -> list[FieldError]:
    role = f"spec.pytorchReplicaSpecs[{rtype}]"
    containers_path = f"{role}.template.spec.containers"
    errors = [] if rtype in _REPLICA_TYPES else [not_supported(role, rtype, _REPLICA_TYPES)]
    rspec = rspec if isinstance(rspec, dict) else {}
    containers = ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        errors.append(required(containers_path, "must be specified"))
    for i, container in enumerate(c if isinstance(c, dict) else {} for c in containers):
        if not container.get("image"):
            errors.append(required(f"{containers_path}[{i}].image", "must be required"))
    if not any(isinstance(c, dict) and c.get("name") == "pytorch" for c in containers):
        errors.append(required(containers_path, "must have at least one container with name pytorch"))
    replicas = rspec.get("replicas")
    if rtype == "Master" and replicas != 1:  # unset counts as wrong: the webhook sees no defaults
        errors.append(forbidden(f"{role}.replicas", "must be 1"))
    elif rtype != "Master" and isinstance(replicas, int) and replicas < 1:
        errors.append(forbidden(f"{role}.replicas", "must be at least 1"))
    return errors


def admission_errors(obj: dict[str, Any]) -> list[str]:
    """What the PyTorchJob validating webhook denies, one apiserver-style string per problem.

    The apiserver answers 403 with f'admission webhook "{WEBHOOK_NAME}" denied the request: '
    followed by these (one bare, several as "[e1, e2]").
    """
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    errors: list[FieldError] = []
    name = str(meta.get("name") or "")
    problems = syntax(name, DNS1035_LABEL, 63)
    if problems:
        errors.append(invalid("metadata.name", name, "should match: " + ",".join(problems)))
    managed_by = (spec.get("runPolicy") or {}).get("managedBy")
    if managed_by is not None and managed_by not in _MANAGED_BY:
        errors.append(not_supported("spec.runPolicy.managedBy", managed_by, _MANAGED_BY))
    specs = spec.get("pytorchReplicaSpecs")
    elastic = spec.get("elasticPolicy")
    if isinstance(elastic, dict):
        if not isinstance(specs, dict) or "Worker" not in specs:
            errors.append(required("spec.pytorchReplicaSpecs[Worker]", "must be configured if elastic policy is used"))
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append(forbidden("spec.elasticPolicy.nProcPerNode", "must not be used with spec.nprocPerNode"))
    if specs is None:
        errors.append(required("spec.pytorchReplicaSpecs", "must be required"))
    for rtype, rspec in (specs or {}).items() if isinstance(specs, dict) else ():
        errors += _replica_errors(str(rtype), rspec)
    return [str(e) for e in errors]
