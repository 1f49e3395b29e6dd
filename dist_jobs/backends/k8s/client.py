"""The connection to a Kubernetes apiserver: the official client's REST layer, bounded in time.

Two costs are kept out of `dist-jobs submit`, a command that should take about as long as
`kubectl create -f` (bench/bench_k8s_submit.py):
* `import kubernetes` runs the package's __init__, which imports the whole client: the kubeconfig
  loader with its OAuth and cloud-auth dependencies, watch, stream, dynamic (~0.25 s). Only
  `kubernetes.client.rest` and `.configuration` are used, so the package is entered without its
  __init__ (`_client_modules`); anything else asked of it later runs the real __init__ then.
* A kubeconfig with a static token or client certificate (what most clusters, and the test tiers,
  hand out) is read here with yaml; any other (exec plugins, auth providers, several files in
  $KUBECONFIG) goes through the official loader, `kubernetes.config`.

Every request has a connect timeout (TCP and TLS handshake) and a read timeout, and urllib3 tries
a connection once more but never re-sends a request that got no answer: a hung apiserver costs at
most CONNECT_S x 2 or READ_S, not the client's default of four tries with no read timeout.
"""

from __future__ import annotations

import atexit
import base64
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml

CONNECT_S = 5.0
READ_S = 10.0
TIMEOUT = (CONNECT_S, READ_S)
_FAST_USER_KEYS = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
}
_FAST_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
_FAST_CLUSTER_KEYS |= {"tls-server-name"}


def _client_modules() -> tuple[Any, Any, Any]:
    """(kubernetes.client.configuration, kubernetes.client.rest, ApiException), without running
    kubernetes/__init__.py unless something already did or does later (module __getattr__)."""
    if "kubernetes" not in sys.modules:
        spec = importlib.util.find_spec("kubernetes")
        if spec is None or spec.origin is None or not spec.submodule_search_locations:
            raise ImportError("the 'kubernetes' package is not installed (pip install 'dist-jobs[k8s]')")
        package = types.ModuleType("kubernetes")
        package.__dict__.update(__path__=list(spec.submodule_search_locations), __spec__=spec, __file__=spec.origin)
        package.__dict__.update(__package__="kubernetes", __getattr__=_full_init(package, spec.origin))
        sys.modules["kubernetes"] = package
    from kubernetes.client import configuration, exceptions, rest  # optional ([k8s]); not for render

    return configuration, rest, exceptions.ApiException


def _full_init(package: types.ModuleType, origin: str) -> Any:
    def __getattr__(name: str) -> Any:  # first use of anything the lean import skipped
        del package.__dict__["__getattr__"]
        exec(compile(Path(origin).read_text(encoding="utf-8"), origin, "exec"), package.__dict__)
        return getattr(package, name)

    return __getattr__


class KubeClient:
    """Requests to one apiserver with the official client's REST layer; JSON in, JSON out."""

    def __init__(self, configuration: Any, namespace: str | None = None) -> None:
        _, rest, self.api_exception = _client_modules()
        from urllib3.util.retry import Retry  # urllib3 comes with kubernetes, an optional dependency ([k8s])

        configuration.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0)
        if not configuration.verify_ssl:
            # insecure-skip-tls-verify is the kubeconfig's own choice (kubectl says nothing either):
            # urllib3 would print InsecureRequestWarning with a URL on every request.
            from urllib3.exceptions import InsecureRequestWarning  # with kubernetes, as above

            warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        self.configuration = configuration
        self.namespace = namespace  # the kubeconfig context's default namespace
        self._rest = rest.RESTClientObject(configuration)

    @property
    def host(self) -> str:
        return str(self.configuration.host)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        for auth in self.configuration.auth_settings().values():  # a token, refreshed by the loader's hook
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def _send(self, method: str, path: str, query: dict[str, Any] | None, body: Any, timeout: Any) -> Any:
        url = self.host.rstrip("/") + path + ("?" + urlencode(query) if query else "")
        return self._rest.request(method, url, headers=self._headers(), body=body, _request_timeout=timeout)

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
        """The decoded JSON answer (None when empty); ApiException for a non-2xx answer."""
        resp = self._send(method, path, query, body, TIMEOUT)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise self.api_exception(http_resp=resp)
        return json.loads(data) if data else None

    def text(self, path: str, query: dict[str, Any] | None = None) -> str:
        resp = self._send("GET", path, query, None, TIMEOUT)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise self.api_exception(http_resp=resp)
        return (data or b"").decode("utf-8", "replace")

    def lines(self, path: str, query: dict[str, Any] | None = None) -> Iterator[str]:
        """A streamed answer line by line as it arrives (no read timeout: a quiet stream is legal)."""
        resp = self._send("GET", path, query, None, (CONNECT_S, None))
        if not 200 <= resp.status <= 299:
            resp.read()
            raise self.api_exception(http_resp=resp)
        pending = b""
        for chunk in resp.response.stream(4096, decode_content=True):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            yield from (line.decode("utf-8", "replace") for line in complete)
        if pending:
            yield pending.decode("utf-8", "replace")


def for_host(host: str, token: str | None = None) -> KubeClient:
    """A client for `host` without a kubeconfig (tests, scripts)."""
    configuration_module, _, _ = _client_modules()
    cfg = configuration_module.Configuration(host=host)
    if token:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    return KubeClient(cfg)


# -- kubeconfig -----------------------------------------------------------------------------------


class KubeconfigError(Exception):
    """The kubeconfig cannot be used: missing, unreadable, or the context is not in it."""


def load(kubeconfig: str | None, context: str | None) -> KubeClient | None:
    """A client from the kubeconfig ($KUBECONFIG, ~/.kube/config), or None when there is none."""
    paths = [kubeconfig] if kubeconfig else (os.environ.get("KUBECONFIG") or "").split(os.pathsep)
    paths = [p for p in paths if p] or [str(Path.home() / ".kube" / "config")]
    if len(paths) > 1:
        return _official(None, context)  # several files are merged: the official loader knows how
    path = Path(paths[0]).expanduser()
    if not path.is_file():
        if kubeconfig:
            raise KubeconfigError(f"{path} does not exist")
        return None
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path} is not a kubeconfig: its top level is a {type(doc).__name__}, not a mapping")
    fast = _fast(doc, path, context)
    return fast if fast is not None else _official(str(path), context)


def _named(doc: dict[str, Any], kind: str, name: str | None) -> dict[str, Any] | None:
    for item in doc.get(kind + "s") or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(kind) or {}
    return None


def _fast(doc: dict[str, Any], path: Path, context: str | None) -> KubeClient | None:
    """Static credentials read here; None when the official loader must do it."""
    name = context or doc.get("current-context")
    ctx = _named(doc, "context", name)
    if ctx is None:
        raise KubeconfigError(f"{path}: no context {name!r} in it (kubectl config get-contexts)")
    cluster, user = _named(doc, "cluster", ctx.get("cluster")), _named(doc, "user", ctx.get("user")) or {}
    if cluster is None or not set(cluster) <= _FAST_CLUSTER_KEYS or not set(user) <= _FAST_USER_KEYS:
        return None
    configuration_module, _, _ = _client_modules()
    cfg = configuration_module.Configuration(host=str(cluster.get("server", "")).rstrip("/"))
    cfg.verify_ssl = not cluster.get("insecure-skip-tls-verify", False)
    cfg.tls_server_name = cluster.get("tls-server-name")
    cfg.ssl_ca_cert = _file(cluster, "certificate-authority", path)
    cfg.cert_file = _file(user, "client-certificate", path)
    cfg.key_file = _file(user, "client-key", path)
    token = user.get("token")
    if user.get("tokenFile") and not token:
        token = (path.parent / user["tokenFile"]).read_text().strip()
    if token:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    return KubeClient(cfg, ctx.get("namespace"))


def _file(section: dict[str, Any], key: str, kubeconfig: Path) -> str | None:
    """A kubeconfig's file reference as a path: `key` relative to the kubeconfig, or `key-data`
    written to a private temporary file (urllib3 takes certificates from files)."""
    if section.get(key + "-data"):
        folder = _private_dir()
        target = folder / f"{key}-{len(os.listdir(folder))}.pem"
        target.write_bytes(base64.b64decode(section[key + "-data"]))
        return str(target)
    return str(kubeconfig.parent / section[key]) if section.get(key) else None


_TEMP: list[Path] = []


def _private_dir() -> Path:
    if not _TEMP:
        _TEMP.append(Path(tempfile.mkdtemp(prefix="dist-jobs-kube-")))  # mode 0700
        atexit.register(shutil.rmtree, _TEMP[0], True)
    return _TEMP[0]


def _official(path: str | None, context: str | None) -> KubeClient:
    # kubernetes: optional ([k8s]), and the render side imports none of it (tests/unit/test_imports.py)
    from kubernetes.config import kube_config
    from kubernetes.config.config_exception import ConfigException

    configuration_module, _, _ = _client_modules()
    cfg = configuration_module.Configuration()
    try:
        kube_config.load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)
        contexts, active = kube_config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        raise KubeconfigError(str(exc)) from None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return KubeClient(cfg, ((chosen or {}).get("context") or {}).get("namespace"))


def in_cluster() -> KubeClient | None:
    """The pod's service account client (as kubectl does without a kubeconfig), None outside a pod."""
    from kubernetes.config import incluster_config  # optional, and not for the render side (as above)
    from kubernetes.config.config_exception import ConfigException

    configuration_module, _, _ = _client_modules()
    cfg = configuration_module.Configuration()
    try:
        incluster_config.load_incluster_config(client_configuration=cfg)
    except ConfigException:
        return None
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as fh:
            namespace = fh.read().strip() or None
    except OSError:
        namespace = None
    return KubeClient(cfg, namespace)
