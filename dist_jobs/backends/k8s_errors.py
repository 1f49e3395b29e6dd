"""Turn the apiserver's answers into messages a person can act on.

The Status body is JSON except for a CRD that is not installed: then the apiserver answers a
plain-text `404 page not found` (KUBERNETES_NOTES section 4), which must not be parsed as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from dist_jobs.errors import BackendError


def _status_body(body: Any) -> dict[str, Any] | None:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and parsed.get("kind") == "Status" else None


def api_error(exc: Any, what: str) -> BackendError:
    """A BackendError for an ApiException raised while doing `what`."""
    code = int(getattr(exc, "status", 0) or 0)
    status = _status_body(getattr(exc, "body", None))
    if status is None:
        if code == 404:
            return BackendError(f"{what}: the apiserver has no such resource type (404 page not found)",
                                "install the Kubeflow training operator's CRD: kubectl apply -f k8s/crds/"
                                "kubeflow.org_pytorchjobs.yaml (or the operator's manifests)")
        return BackendError(f"{what}: HTTP {code} {getattr(exc, 'reason', '')}".rstrip(),
                            "check the apiserver address and your credentials (kubectl auth can-i create pytorchjobs)")
    message = status.get("message", "")
    reason = status.get("reason", "")
    if code == 409:
        return BackendError(f"{what}: {message} (409 AlreadyExists)",
                            "pick another --name, or delete the old job: dist-jobs cancel --backend k8s NAME")
    if code == 422:
        causes = (status.get("details") or {}).get("causes") or []
        lines = [f"  - {c.get('field', '?')}: {c.get('message', '')}" for c in causes] or [f"  - {message}"]
        return BackendError(f"{what}: the apiserver rejected the manifest (422 Invalid):\n" + "\n".join(lines),
                            "fix those fields in job.yaml; `dist-jobs render --backend k8s` shows the manifest")
    if code == 403:
        hint = ("the training operator's admission webhook refused it; fix what it names"
                if "admission webhook" in message else "your account lacks the permission (kubectl auth can-i)")
        return BackendError(f"{what}: {message} (403 {reason or 'Forbidden'})", hint)
    if code == 404:
        return BackendError(f"{what}: {message} (404 NotFound)",
                            "check the name and --namespace: dist-jobs list --backend k8s")
    if code == 400:
        return BackendError(f"{what}: {message} (400 {reason or 'BadRequest'})",
                            "an unknown or misspelled field is refused under fieldValidation=Strict: fix the spec")
    return BackendError(f"{what}: {message or reason} (HTTP {code})", "see the apiserver's message above")


def unreachable(host: str, exc: BaseException) -> BackendError:
    return BackendError(f"cannot reach the Kubernetes apiserver at {host}: {type(exc).__name__}: {exc}",
                        "is the cluster up and the kubeconfig current? try `kubectl cluster-info`")
