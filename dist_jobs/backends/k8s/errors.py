"""Turn the apiserver's answers, and its silences, into messages a person can act on.

The Status body is JSON except for a resource type the apiserver does not serve (the CRD is not
installed, or not at this version): then it answers a plain-text `404 page not found`
(KUBERNETES_NOTES section 4), which must not be parsed as JSON. No answer at all is one of: an
untrusted TLS certificate (the kubeconfig's CA is wrong, not the cluster down), a timeout (a
create that timed out may still have created the job), or no connection.
"""

from __future__ import annotations

import json
from typing import Any

from dist_jobs.backends.handle import Handle
from dist_jobs.backends.k8s.client import CONNECT_S, answer_s
from dist_jobs.backends.k8s.kinds import KINDS
from dist_jobs.errors import BackendError


def _status_body(body: Any) -> dict[str, Any] | None:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and parsed.get("kind") == "Status" else None


# The apiserver's whole answer for a path it does not serve (a resource whose CRD is missing).
NOT_SERVED = "404 page not found"


def handle(kind: str, namespace: str, name: str) -> str:
    """The job's handle, for hints: a bare name would be looked up as a PyTorchJob."""
    return str(Handle("k8s", name, namespace=namespace, kind=kind))


def api_error(
    exc: Any,
    what: str,
    kind: str = "PyTorchJob",
    namespace: str = "",
    name: str = "",
    host: str = "",
    forbidden: str = "",
) -> BackendError:
    """A BackendError for an ApiException raised while doing `what` to the `kind` object `name` in
    `namespace` (the hints name it by its handle), asked of the server at `host`. `forbidden`:
    the hint for a 403 the caller knows better than "ask for the permission" (what the object is for)."""
    code = int(getattr(exc, "status", 0) or 0)
    status = _status_body(getattr(exc, "body", None))
    if code == 0 and "SSL" in str(getattr(exc, "reason", "")):  # rest.py's wrapping of urllib3's SSLError
        return _tls(what, str(exc.reason).splitlines()[-1])
    if status is None:
        return _plain_error(code, str(getattr(exc, "reason", "") or ""), what, kind, _text(exc), host)
    message = str(status.get("message", ""))
    reason = str(status.get("reason", ""))
    if code == 409:
        return _exists(what, message, kind, namespace, name)
    if code == 422:
        causes = (status.get("details") or {}).get("causes") or []
        lines = [f"  - {c.get('field') or '?'}: {c.get('message', '')}" for c in causes] or [f"  - {message}"]
        return BackendError(
            f"{what}: the apiserver rejected the manifest (422 Invalid):\n" + "\n".join(lines),
            "fix those fields in job.yaml; `dist-jobs render --backend k8s` shows the manifest",
        )
    if code == 403:
        hint = (
            "the training operator's admission webhook refused it; fix what it names in job.yaml"
            if "admission webhook" in message
            else forbidden or "your account lacks the permission: ask for it, or check with `kubectl auth can-i`"
        )
        return BackendError(f"{what}: {message} (403 {reason or 'Forbidden'})", hint)
    if code == 404:
        return _not_found(what, message, status.get("details") or {}, kind)
    if code == 400:
        return BackendError(
            f"{what}: {message} (400 {reason or 'BadRequest'})",
            _bad_request_hint(message, handle(kind, namespace or "NAMESPACE", name or "NAME")),
        )
    if code == 401:
        return BackendError(
            f"{what}: {message or 'Unauthorized'} (401)",
            "the credentials in the kubeconfig are missing or expired: log in again",
        )
    return BackendError(f"{what}: {message or reason} (HTTP {code})", "see the apiserver's message above")


def _not_found(what: str, message: str, details: dict[str, Any], kind: str) -> BackendError:
    if details.get("kind") == "namespaces":
        return BackendError(
            f"{what}: {message} (404 NotFound)",
            f"create the namespace (kubectl create namespace {details.get('name')}) or choose an existing "
            "one: k8s.namespace in job.yaml, --namespace on the command line",
        )
    return BackendError(
        f"{what}: {message} (404 NotFound)",
        f"check the name and --namespace/--context: dist-jobs list --backend k8s --kind {kind}",
    )


def _exists(what: str, message: str, kind: str, namespace: str, name: str) -> BackendError:
    job = handle(kind, namespace or "NAMESPACE", name or "NAME")
    if "being deleted" in message:  # a Foreground delete keeps the object until its pods are gone
        known = KINDS.get(kind)
        resource = f"{known.plural}.{known.group}" if known else kind.lower()
        return BackendError(
            f"{what}: {message} (409 AlreadyExists): the old job is still being deleted",
            f"wait for the deletion to finish, then submit again: kubectl wait --for=delete "
            f"{resource}/{name or 'NAME'} -n {namespace or 'NAMESPACE'} --timeout=10m "
            f"(or dist-jobs status {job} until it is not found)",
        )
    return BackendError(
        f"{what}: {message} (409 AlreadyExists)",
        f"pick another --name, or delete the old job: dist-jobs cancel {job}",
    )


def _text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    return body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")


def _plain_error(code: int, reason: str, what: str, kind: str, body: str, host: str) -> BackendError:
    if code == 404 and body.strip() == NOT_SERVED:
        known = KINDS.get(kind)
        resource, install = (known.crd, known.install) if known else (kind, "install the CRD that serves it")
        return BackendError(
            f"{what}: the apiserver does not serve {resource} ({NOT_SERVED}): "
            f"the {kind} CRD is not installed in this cluster",
            install,
        )
    if code == 404:  # an apiserver answers a Status, or its plain-text line: an HTML page is another server
        looks = "an HTML page" if "<html" in body[:512].lower() else "no Kubernetes Status"
        return BackendError(
            f"{what}: the server{f' at {host}' if host else ''} answered HTTP 404 with {looks}: "
            "it is not a Kubernetes apiserver",
            "check the cluster's server address in the kubeconfig (kubectl config view --minify) and "
            "--kubeconfig/--context",
        )
    return BackendError(
        f"{what}: HTTP {code} {reason}".rstrip(),
        "check the apiserver address in the kubeconfig and your credentials (kubectl auth can-i)",
    )


def _bad_request_hint(message: str, job: str) -> str:
    if "strict decoding error" in message or "unknown field" in message:
        return "fieldValidation=Strict refuses unknown or misspelled fields: fix them in job.yaml"
    if "waiting to start" in message or "ContainerCreating" in message or "PodInitializing" in message:
        return f"the container has not started yet: retry in a moment (dist-jobs status {job})"
    return "the apiserver refused the request as malformed: see its message"


def unreachable(host: str, exc: BaseException, what: str = "", job: str = "", method: str = "GET") -> BackendError:
    """The apiserver did not answer `method` at all: an untrusted certificate, a timeout, or no connection."""
    import ssl  # a failed connection's alone: the CLI reads this package for its flags

    cause: BaseException = getattr(exc, "reason", None) or exc  # urllib3's MaxRetryError wraps the real one
    chain = [cause, cause.__context__, *getattr(cause, "args", ())]
    if any(isinstance(c, ssl.SSLCertVerificationError) for c in chain) or "CERTIFICATE_VERIFY_FAILED" in str(cause):
        return _tls(what or f"connect to {host}", str(cause))
    name = type(cause).__name__
    if "Timeout" in name or "timed out" in str(cause):
        creating = method == "POST"
        return BackendError(
            f"{what or 'request'}: the Kubernetes apiserver at {host} did not answer in time "
            f"({CONNECT_S:.0f} s to connect, {answer_s(method):.0f} s to answer)",
            f"the job may have been created all the same: check with `dist-jobs status {job or 'k8s://NS/KIND/NAME'}` "
            "before submitting again"
            if creating
            else "the apiserver is overloaded or a firewall drops the traffic: try `kubectl cluster-info`",
        )
    return BackendError(
        f"cannot reach the Kubernetes apiserver at {host}: {name}: {cause}",
        "is the cluster up and the kubeconfig current? try `kubectl cluster-info`",
    )


def _tls(what: str, detail: str) -> BackendError:
    return BackendError(
        f"{what}: the apiserver's TLS certificate is not trusted ({detail})",
        "the kubeconfig's certificate-authority (or -data) for this cluster does not match the server: "
        "fetch a current kubeconfig, or pick the right one with --kubeconfig/--context",
    )


def not_started(kind: str, namespace: str, job: str, pod: str, why: str) -> BackendError:
    """`logs` of a pod whose container has not started: the apiserver would answer with nothing."""
    return BackendError(
        f"{kind} {namespace}/{job}: pod {pod} is {why}: it has no log yet",
        f"wait for it to start: dist-jobs status {handle(kind, namespace, job)}; why it waits: "
        f"kubectl describe pod {pod} -n {namespace}",
    )


def no_config(kubeconfig: str | None, context: str | None, exc: BaseException | None) -> BackendError:
    if exc is None:
        return BackendError(
            "no Kubernetes configuration: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not running in a pod",
            "set KUBECONFIG or pass --kubeconfig FILE (and --context NAME)",
        )
    return BackendError(
        f"cannot load kubeconfig {kubeconfig or '(default)'}, context {context or '(current)'}: {exc}",
        "check --kubeconfig/--context: `kubectl config get-contexts`",
    )
