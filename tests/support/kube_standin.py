"""A loopback stand-in for kube-apiserver, serving custom resources from vendored CRDs.

Calibrated to answer like a real apiserver (codes, Status bodies and messages verbatim from
the real one) for what the k8s backend does: create, get, list, delete custom objects, list
pods by label and read their logs. Validation is support.k8s_offline.validate, i.e. the CRD schema
with the apiserver's pruning and defaulting; `webhooks=True` adds the training-operator's
PyTorchJob admission webhook. Pod logs can stream (follow=true, chunked) from a Queue. `latency`
holds every answer back (a loaded apiserver, a slow webhook). A custom object takes a JSON merge
patch (409 when its metadata.resourceVersion is not the stored one, as the real registry's
optimistic concurrency answers). What a job owns (ConfigMaps, ServiceAccounts, Roles,
RoleBindings) is created, read and deleted as given, in `objects`, unvalidated. Not implemented
(405): PUT, other patch types, watch, subresources.

    with FakeKubeAPI([crd_path("PyTorchJob")]) as api:
        cfg = kubernetes.client.Configuration(); cfg.host = api.url
        ...
        api.store[("pytorchjobs", "default", "job")]["status"] = {...}   # play the operator
        api.pods[("default", "job-master-0")] = {...}; api.pod_logs[("default", "job-master-0")] = "..."
        api.pod_logs[...] = queue.Queue()   # a running container: follow=true streams what is put, until None
"""

from __future__ import annotations

import copy
import json
import queue
import random
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from support.k8s_offline import validate as kv

_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet


@dataclass
class Request:
    """One request as the stand-in saw it, plus what it answered."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any
    status: int = 0
    warnings: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names


class Reply(Exception):
    """Raised by a route to answer: JSON (dict) or text body, with extra headers."""

    def __init__(self, code: int, body: Any, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(code)
        self.code, self.body, self.headers = code, body, headers or []


def failure(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> Reply:
    """The apiserver's answer to a failed request: HTTP `code` with a Status body."""
    return Reply(code, status(code, reason, message, details))


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _aggregate(errors: list[str]) -> str:
    """utilerrors.Aggregate: one error bare, several as [e1, e2] (duplicates once)."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: k=v, k==v, k!=v, k, !k (comma = AND)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        elif " " in term or "(" in term:
            raise failure(
                400,
                "BadRequest",
                f"unable to parse requirement: {term!r}: set-based selectors are not supported by the stand-in",
            )
        else:
            ok = term in labels
        if not ok:
            return False
    return True


class FakeKubeAPI:
    """Context manager serving the given CRDs on 127.0.0.1:<ephemeral port>."""

    def __init__(
        self,
        crds: list[Path],
        webhooks: bool = True,
        default_field_validation: str = "Warn",
        server_version: str = "v1.20.2",
    ) -> None:
        self.crds = {(i.group, i.plural): i for i in (kv.crd_info(Path(p)) for p in crds)}
        self.webhooks = webhooks
        self.default_field_validation = default_field_validation
        self.server_version = server_version
        self.requests: list[Request] = []
        self.store: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, namespace, name)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # owned kinds, (plural, namespace, name)
        self.forbidden: set[str] = set()  # owned kinds (plurals) the caller may not create: 403, as RBAC says
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name)
        # text, per-container texts, or a Queue of chunks (None ends the stream) for a running container
        self.pod_logs: dict[tuple[str, str], str | dict[str, str] | queue.Queue[str | None]] = {}
        self.follow_timeout = 10.0  # a followed log with nothing new for this long ends, as if the pod stopped
        self.latency = 0.0  # seconds each answer is held back: a loaded apiserver, a slow admission webhook
        self.lock = threading.RLock()
        self._rv = 100
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "use FakeKubeAPI as a context manager"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeKubeAPI:
        api = self

        class Handler(_Handler):
            owner = api

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-kube-api", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def next_rv(self) -> str:
        with self.lock:
            self._rv += 1
            return str(self._rv)

    def set_status(self, plural: str, namespace: str, name: str, new_status: dict[str, Any]) -> None:
        """Play the operator: replace a stored object's status (as the status subresource would)."""
        with self.lock:
            obj = self.store[(plural, namespace, name)]
            obj["status"] = copy.deepcopy(new_status)
            obj["metadata"]["resourceVersion"] = self.next_rv()

    # --- routing ------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], raw: bytes) -> Reply:
        parts = [p for p in path.split("/") if p]
        if parts == ["version"] and method == "GET":
            return Reply(200, self._version())
        plain = _plain(parts)
        if plain is not None:
            return self._plain(method, *plain, query, raw)
        if parts[:2] == ["api", "v1"]:
            return self._core(method, parts[2:], query)
        if parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
            infos = [i for i in self.crds.values() if i.group == group and version in i.versions]
            if infos and not rest:
                return Reply(200, self._discovery(group, version, infos)) if method == "GET" else _not_allowed()
            ns = rest[1] if rest[:1] == ["namespaces"] and len(rest) >= 3 else None
            rest = rest[2:] if ns is not None else rest
            info = self.crds.get((group, rest[0])) if rest else None
            if info is not None and version in info.versions and (ns is None or info.namespaced):
                return self._resource(info, version, method, ns, rest[1:], query, raw)
        raise Reply(404, "404 page not found\n")

    def _version(self) -> dict[str, str]:
        major, minor = self.server_version.lstrip("v").split(".")[:2]
        return {
            "major": major,
            "minor": minor,
            "gitVersion": self.server_version,
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2021-01-13T13:20:00Z",
            "goVersion": "go1.15.5",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _discovery(self, group: str, version: str, infos: list[kv.CrdInfo]) -> dict[str, Any]:
        resources = []
        for info in infos:
            resources.append(
                {
                    "name": info.plural,
                    "singularName": info.singular,
                    "namespaced": info.namespaced,
                    "kind": info.kind,
                    "verbs": ["create", "delete", "get", "list"],
                }
            )
            resources.append(
                {
                    "name": f"{info.plural}/status",
                    "singularName": "",
                    "namespaced": info.namespaced,
                    "kind": info.kind,
                    "verbs": ["get"],
                }
            )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": resources,
        }

    def _resource(
        self,
        info: kv.CrdInfo,
        version: str,
        method: str,
        ns: str | None,
        rest: list[str],
        query: dict[str, list[str]],
        raw: bytes,
    ) -> Reply:
        if len(rest) > 1 or query.get("watch", [""])[0] in ("true", "1"):
            return _not_allowed()
        name = rest[0] if rest else None
        if name is None:
            if method == "GET":
                return self._list(info, version, ns, query)
            if method == "POST" and ns is not None:
                return self._create(info, version, ns, query, raw)
            return _not_allowed()
        if ns is None and info.namespaced:  # items of namespaced kinds only live under namespaces/
            raise Reply(404, "404 page not found\n")
        if method == "GET":
            return Reply(200, copy.deepcopy(self._get(info, ns or "", name)))
        if method == "DELETE" and ns is not None:
            return self._delete(info, ns, name, query)
        if method == "PATCH" and ns is not None:
            return self._patch(info, ns, name, raw)
        return _not_allowed()

    def _patch(self, info: kv.CrdInfo, ns: str, name: str, raw: bytes) -> Reply:
        """A JSON merge patch (RFC 7386); a resourceVersion in it must be the stored one."""
        patch = json.loads(raw)
        with self.lock:
            obj = self._get(info, ns, name)
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
                raise failure(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {info.plural}.{info.group} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    {"name": name, "group": info.group, "kind": info.plural},
                )
            merged = merge_patch(obj, patch)
            merged["metadata"]["resourceVersion"] = self.next_rv()
            self.store[(info.plural, ns, name)] = merged
            return Reply(200, copy.deepcopy(merged))

    def _plain(
        self, method: str, prefix: str, plural: str, ns: str, name: str | None, query: dict[str, list[str]], raw: bytes
    ) -> Reply:
        """The kinds a job owns: kept as given (no validation, no defaults)."""
        key = (plural, ns, name or "")
        with self.lock:
            if method == "POST" and name is None and plural in self.forbidden:
                group = prefix.split("/")[1] if prefix.startswith("apis/") else ""
                message = (
                    f'{plural}{"." + group if group else ""} is forbidden: User "dist-jobs-test" cannot create '
                    f'resource "{plural}" in API group "{group}" in the namespace "{ns}"'
                )
                raise failure(403, "Forbidden", message, {"kind": plural})
            if method == "POST" and name is None:
                obj = json.loads(raw)
                key = (plural, ns, obj["metadata"]["name"])
                if key in self.objects:
                    raise failure(409, "AlreadyExists", f'{plural} "{key[2]}" already exists', {"name": key[2]})
                obj["metadata"].update(namespace=ns, uid=new_uid(), creationTimestamp=_now())
                if query.get("dryRun", [""])[0] != "All":
                    obj["metadata"]["resourceVersion"] = self.next_rv()
                    self.objects[key] = obj
                return Reply(201, copy.deepcopy(obj))
            if name is not None and key not in self.objects:
                raise failure(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
            if method == "GET" and name is not None:
                return Reply(200, copy.deepcopy(self.objects[key]))
            if method == "DELETE" and name is not None:
                del self.objects[key]
                return Reply(200, status(200, "", "", {"name": name, "kind": plural}) | {"status": "Success"})
        return _not_allowed()

    # --- CREATE, in the apiserver's order ------------------------------------------------

    def _create(self, info: kv.CrdInfo, version: str, ns: str, query: dict[str, list[str]], raw: bytes) -> Reply:
        mode, dry_run = self._create_options(query)
        obj = _decode(info, raw)
        api_version = f"{info.group}/{version}"
        if obj.get("apiVersion") != api_version:
            raise failure(
                400,
                "BadRequest",
                f"the API version in the data ({obj.get('apiVersion', '')}) "
                f"does not match the expected API version ({api_version})",
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise failure(
                400,
                "BadRequest",
                f'{info.kind} in version "{version}" cannot be handled as a {info.kind}: metadata must be an object',
            )
        name = str(meta.get("name") or "")
        if obj.get("kind") != info.kind:
            _invalid_reply(
                info.group,
                str(obj.get("kind")),
                name,
                [
                    kv.FieldError(
                        "kind", "FieldValueInvalid", f'Invalid value: "{obj.get("kind")}": must be {info.kind}'
                    )
                ],
            )
        if meta.get("namespace") not in (None, "", ns):
            raise failure(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        meta["namespace"] = ns
        stored, unknown = kv.prune_and_default(obj, info.path)
        if unknown and mode == "Strict":
            fields = ", ".join(f'unknown field "{p}"' for p in unknown)
            raise failure(
                400,
                "BadRequest",
                f'{info.kind} in version "{version}" cannot be handled as '
                f"a {info.kind}: strict decoding error: {fields}",
            )
        warnings = [("Warning", "299 - " + json.dumps(f'unknown field "{p}"')) for p in unknown if mode == "Warn"]
        if not name and meta.get("generateName"):  # rest.BeforeCreate names it before validating
            stored["metadata"]["name"] = name = generate_name(str(meta["generateName"]))
        errors = kv.validate(stored, info.path, strict=False)
        if errors:
            _invalid_reply(info.group, info.kind, name, errors)
        if self.webhooks and info.kind == "PyTorchJob":
            denied = kv.admission_errors(stored)
            if denied:
                raise failure(
                    403, "Forbidden", f'admission webhook "{kv.WEBHOOK_NAME}" denied the request: {_aggregate(denied)}'
                )
        return Reply(201, self._commit(info, stored, dry_run), warnings)

    def _create_options(self, query: dict[str, list[str]]) -> tuple[str, bool]:
        """ValidateCreateOptions runs before the body is even decoded."""
        mode = query.get("fieldValidation", [""])[0]
        dry_run = query.get("dryRun", [])
        problems = []
        if any(d != "All" for d in dry_run):
            shown = ", ".join(json.dumps(d) for d in dry_run)
            problems.append(
                kv.FieldError(
                    "dryRun",
                    "FieldValueNotSupported",
                    f'Unsupported value: []string{{{shown}}}: supported values: "All"',
                )
            )
        if mode not in ("", "Ignore", "Warn", "Strict"):
            problems.append(
                kv.FieldError(
                    "fieldValidation",
                    "FieldValueNotSupported",
                    f'Unsupported value: {json.dumps(mode)}: supported values: "", "Ignore", "Strict", "Warn"',
                )
            )
        if problems:
            _invalid_reply("meta.k8s.io", "CreateOptions", "", problems)
        return mode or self.default_field_validation, bool(dry_run)

    def _commit(self, info: kv.CrdInfo, obj: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        meta = obj["metadata"]
        key = (info.plural, meta["namespace"], meta["name"])
        with self.lock:
            if key in self.store:
                # the apiserver's registry store prefixes this while the old object is Terminating
                deleting = "object is being deleted: " if self.store[key]["metadata"].get("deletionTimestamp") else ""
                raise failure(
                    409,
                    "AlreadyExists",
                    f'{deleting}{info.plural}.{info.group} "{meta["name"]}" already exists',
                    {"name": meta["name"], "group": info.group, "kind": info.plural},
                )
            stamp = _now()
            meta.update(uid=new_uid(), generation=1, creationTimestamp=stamp)
            meta["managedFields"] = [
                {
                    "manager": "OpenAPI-Generator",
                    "operation": "Update",
                    "apiVersion": obj["apiVersion"],
                    "time": stamp,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {},
                }
            ]
            if not dry_run:  # a dry run gets uid and timestamp but no resourceVersion
                meta["resourceVersion"] = self.next_rv()
                self.store[key] = copy.deepcopy(obj)
        return obj

    def _get(self, info: kv.CrdInfo, ns: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.store.get((info.plural, ns, name))
        if obj is None:
            raise failure(
                404,
                "NotFound",
                f'{info.plural}.{info.group} "{name}" not found',
                {"name": name, "group": info.group, "kind": info.plural},
            )
        return obj

    def _list(self, info: kv.CrdInfo, version: str, ns: str | None, query: dict[str, list[str]]) -> Reply:
        selector = query.get("labelSelector", [""])[0]
        with self.lock:
            items = [
                copy.deepcopy(o)
                for (plural, o_ns, _), o in sorted(self.store.items())
                if plural == info.plural and ns in (None, o_ns) and _selector_matches(selector, _labels(o))
            ]
            rv = str(self._rv)
        return Reply(
            200,
            {
                "apiVersion": f"{info.group}/{version}",
                "kind": info.list_kind,
                "metadata": {"continue": "", "resourceVersion": rv},
                "items": items,
            },
        )

    def _delete(self, info: kv.CrdInfo, ns: str, name: str, query: dict[str, list[str]]) -> Reply:
        with self.lock:
            obj = self._get(info, ns, name)
            if query.get("dryRun", [""])[0] != "All":
                del self.store[(info.plural, ns, name)]
        details = {"name": name, "group": info.group, "kind": info.plural, "uid": obj["metadata"]["uid"]}
        return Reply(
            200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    def _core(self, method: str, parts: list[str], query: dict[str, list[str]]) -> Reply:
        """Pods only: list by label, get, and read logs, from self.pods / self.pod_logs."""
        if method != "GET":
            return _not_allowed()
        if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == "pods":
            ns, rest = parts[1], parts[3:]
        elif parts == ["pods"]:  # all namespaces: list only
            ns, rest = None, []
        else:
            raise Reply(404, "404 page not found\n")
        if not rest:
            selector = query.get("labelSelector", [""])[0]
            with self.lock:
                items = [
                    _pod(o, o_ns, o_name)
                    for (o_ns, o_name), o in sorted(self.pods.items())
                    if ns in (None, o_ns) and _selector_matches(selector, _labels(o))
                ]
            return Reply(
                200,
                {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)}, "items": items},
            )
        with self.lock:
            pod = self.pods.get((ns or "", rest[0]))
            logs = self.pod_logs.get((ns or "", rest[0]), "")
        if pod is None:
            raise failure(404, "NotFound", f'pods "{rest[0]}" not found', {"name": rest[0], "kind": "pods"})
        if len(rest) == 1:
            return Reply(200, _pod(pod, ns or "", rest[0]))
        if rest[1:] == ["log"]:
            if isinstance(logs, queue.Queue):
                follow = query.get("follow", [""])[0] in ("true", "1")
                return Reply(200, logs if follow else _drain(logs))
            text = _log_text(rest[0], logs, query)
            # an empty log is 204 with no body and no Content-Type (v1.20.2, pod not yet on a node)
            return Reply(200, text) if text else Reply(204, None)
        return _not_allowed()


def _decode(info: kv.CrdInfo, raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw or b"null")
    except ValueError as exc:
        obj, error = None, f"json parse error: {exc}"
    else:
        error = "json parse error: not a JSON object"
    if not isinstance(obj, dict):
        raise failure(
            400,
            "BadRequest",
            f"the object provided is unrecognized (must be of type {info.kind}): couldn't get version/kind; {error}",
        )
    if "kind" not in obj:
        raise failure(400, "BadRequest", f"Object 'Kind' is missing in '{raw.decode('utf-8', 'replace')}'")
    return obj


def _invalid_reply(group: str, kind: str, name: str, errors: list[kv.FieldError]) -> None:
    """errors.NewInvalid: 422, one cause per field error."""
    causes = [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors]
    message = f'{kind}.{group} "{name}" is invalid: {_aggregate([str(e) for e in errors])}'
    details = {"name": name} if name else {}  # omitempty
    raise failure(422, "Invalid", message, {**details, "group": group, "kind": kind, "causes": causes})


_PLAIN = {("api/v1", "configmaps"), ("api/v1", "serviceaccounts")}
_PLAIN |= {("apis/rbac.authorization.k8s.io/v1", p) for p in ("roles", "rolebindings")}


def _plain(parts: list[str]) -> tuple[str, str, str, str | None] | None:
    """(API prefix, plural, namespace, name or None) of a path to a kind a job owns, else None."""
    for prefix, plural in _PLAIN:
        head = [*prefix.split("/"), "namespaces"]
        if (
            parts[: len(head)] == head
            and len(parts) in (len(head) + 2, len(head) + 3)
            and parts[len(head) + 1] == plural
        ):
            name = parts[len(head) + 2] if len(parts) == len(head) + 3 else None
            return prefix, plural, parts[len(head)], name
    return None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: a mapping merges key by key (null removes), anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _pod(obj: dict[str, Any], ns: str, name: str) -> dict[str, Any]:
    pod = {"kind": "Pod", "apiVersion": "v1", **copy.deepcopy(obj)}
    pod["metadata"] = {"name": name, "namespace": ns, **pod.get("metadata", {})}
    return pod


def _drain(chunks: queue.Queue[str | None]) -> str:
    """Without follow=true the apiserver answers with what the container has written so far."""
    out = []
    while True:
        try:
            chunk = chunks.get_nowait()
        except queue.Empty:
            return "".join(out)
        if chunk is None:
            chunks.put(None)  # the stream stays ended for the next reader
            return "".join(out)
        out.append(chunk)


def _log_text(name: str, logs: str | dict[str, str], query: dict[str, list[str]]) -> str:
    if isinstance(logs, dict):
        container = query.get("container", [""])[0]
        if not container and len(logs) > 1:
            choices = " ".join(sorted(logs))
            raise failure(
                400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: [{choices}]"
            )
        if container and container not in logs:
            raise failure(400, "BadRequest", f"container {container} is not valid for pod {name}")
        logs = logs[container] if container else next(iter(logs.values()), "")
    tail = query.get("tailLines", [""])[0]
    if tail.isdigit():
        lines = logs.splitlines(keepends=True)
        logs = "".join(lines[-int(tail) :]) if int(tail) else ""
    return logs


def _not_allowed() -> Reply:
    return failure(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})


def generate_name(prefix: str) -> str:
    """names.SimpleNameGenerator: prefix cut to 58 characters plus 5 random ones."""
    return prefix[:58] + "".join(random.choice(_GENERATE_CHARS) for _ in range(5))


def new_uid() -> str:
    return str(uuid.uuid4())


class _Handler(BaseHTTPRequestHandler):
    owner: FakeKubeAPI
    protocol_version = "HTTP/1.1"  # keep-alive, as urllib3's pool expects

    def log_message(self, *_args: Any) -> None:  # quiet: pytest shows failures, not access logs
        pass

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        record = Request(
            self.command,
            url.path,
            query,
            self.headers.get("Content-Type"),
            body,
            headers={k.lower(): v for k, v in self.headers.items()},
        )  # names are case-insensitive
        with self.owner.lock:
            self.owner.requests.append(record)
        time.sleep(self.owner.latency)
        try:
            reply = self.owner.handle(self.command, url.path, query, raw)
        except Reply as exc:
            reply = exc
        except Exception as exc:
            reply = failure(500, "InternalError", f"stand-in error: {exc!r}")
        record.status = reply.code
        record.warnings = [v for k, v in reply.headers if k == "Warning"]
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        if isinstance(reply.body, queue.Queue):
            self._stream(reply.body)
            return
        if reply.body is None:
            self.send_response(reply.code)
            self.end_headers()
            return
        if isinstance(reply.body, str):
            data, ctype = reply.body.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(reply.body).encode(), "application/json"
        self.send_response(reply.code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in reply.headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks: queue.Queue[str | None]) -> None:
        """A followed log: chunked transfer, each chunk sent as soon as it is queued."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            while True:
                try:
                    chunk = chunks.get(timeout=self.owner.follow_timeout)
                except queue.Empty:
                    chunk = None
                if chunk is None:
                    break
                if chunk:  # an empty chunk would read as the end of the stream
                    data = chunk.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the client stopped following
            pass

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve


def sample_pytorchjob(name: str = "llm-train-demo", namespace: str = "default") -> dict[str, Any]:
    """A PyTorchJob the real apiserver and the operator's webhook accept (Master 1 + Worker 1).

    Integer quantities (`nvidia.com/gpu: 8`) on purpose: the apiserver takes them, some client
    model classes do not.
    """

    def template() -> dict[str, Any]:
        container = {
            "name": "pytorch",
            "image": "ghcr.io/example/train:1.0",
            "command": ["python", "-m", "train"],
            "env": [{"name": "DIST_JOBS_BACKEND", "value": "k8s"}],
            "resources": {"limits": {"nvidia.com/gpu": 8, "cpu": 32, "memory": "64Gi"}},
            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
        }
        return {"spec": {"containers": [container], "volumes": [{"name": "ckpt", "emptyDir": {}}]}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "dist-jobs"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template()},
                "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": template()},
            }
        },
    }


TOKEN = "t0ken-for-tests"


def write_kubeconfig(path: Path, server: str) -> Path:
    """Two contexts on one cluster: `standin` (no namespace) and `team-ml` (namespace ml)."""
    contexts = [
        {"name": "standin", "context": {"cluster": "standin", "user": "tester"}},
        {"name": "team-ml", "context": {"cluster": "standin", "user": "tester", "namespace": "ml"}},
    ]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "standin",
                "preferences": {},
                "clusters": [{"name": "standin", "cluster": {"server": server}}],
                "users": [{"name": "tester", "user": {"token": TOKEN}}],
                "contexts": contexts,
            }
        )
    )
    return path


@contextmanager
def untrusted_https(folder: Path, handler: type[BaseHTTPRequestHandler] = BaseHTTPRequestHandler) -> Iterator[str]:
    """An HTTPS server on loopback serving `handler`, whose certificate no CA signed (openssl writes
    it and its key into `folder`): yields the server's URL, and shuts it down on leaving."""
    key, cert = folder / "k.pem", folder / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
