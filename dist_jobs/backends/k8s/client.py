"""The connection to a Kubernetes apiserver: the official client's REST layer, bounded in time.

`kubernetes` is imported in the functions that build a client, never at this module's import: it
is the optional `[k8s]` extra, and the render side, which imports every module of this package
(tests/unit/test_imports.py), must not pay for it. It is imported whole, the ordinary way, so a
program that imports it later gets the same package anyone else would.

A kubeconfig is read only by the official loader (`kubernetes.config.kube_config`), so every kind
of credential kubectl accepts works: static tokens, client certificates, exec plugins, auth
providers, several files merged from $KUBECONFIG.

Every request has a connect timeout (TCP and TLS handshake) and a read timeout, and urllib3 tries
a connection once more but never re-sends a request that got no answer: a hung apiserver costs at
most CONNECT_S x 2 or the read timeout, not the client's default of four tries with no read timeout.
A read (GET) waits READ_S for its answer. A write waits WRITE_S, as long as the apiserver itself
lets a request run (its --request-timeout, 1 min by default), admission webhooks included (10 s
each by default, up to 30): cut shorter, a create that was merely slow would be left unknown.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from dist_jobs.errors import BackendError

CONNECT_S = 5.0
READ_S = 10.0
WRITE_S = 60.0


def answer_s(method: str) -> float:
    """How long a request with this method waits for its answer once connected."""
    return READ_S if method == "GET" else WRITE_S


def _kubernetes() -> Any:
    """The `kubernetes` package, with its REST layer and kubeconfig loader, or a BackendError."""
    try:
        # here, not at the top: an optional extra ([k8s]) that the render side must not import
        import kubernetes.client.rest
        import kubernetes.config
    except ImportError as exc:
        raise BackendError(
            f"the Kubernetes backend needs the 'kubernetes' package, which cannot be imported: {exc}",
            "pip install 'dist-jobs[k8s]'",
        ) from None
    return kubernetes


class KubeClient:
    """Requests to one apiserver with the official client's REST layer; JSON in, JSON out."""

    def __init__(self, configuration: Any, namespace: str | None = None) -> None:
        kubernetes = _kubernetes()
        self.api_exception = kubernetes.client.exceptions.ApiException
        from urllib3.util.retry import Retry  # urllib3 comes with kubernetes, an optional dependency ([k8s])

        configuration.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0)
        if not configuration.verify_ssl:
            # insecure-skip-tls-verify is the kubeconfig's own choice (kubectl says nothing either):
            # urllib3 would print InsecureRequestWarning with a URL on every request.
            from urllib3.exceptions import InsecureRequestWarning  # with kubernetes, as above

            warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        self.configuration = configuration
        self.namespace = namespace  # the kubeconfig context's default namespace
        self._rest = kubernetes.client.rest.RESTClientObject(configuration)

    @property
    def host(self) -> str:
        return str(self.configuration.host)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        for auth in self.configuration.auth_settings().values():  # a token, refreshed by the loader's hook
            if auth.get("in") == "header" and auth.get("value"):
                # stripped as client-go does: a tokenFile ending in a newline would be an invalid header
                headers[auth["key"]] = auth["value"].strip()
        return headers

    def _send(
        self, method: str, path: str, query: dict[str, Any] | None, body: Any = None, streamed: bool = False
    ) -> Any:
        """The raw answer; a streamed one has no read timeout (a quiet stream is legal)."""
        url = self.host.rstrip("/") + path + ("?" + urlencode(query) if query else "")
        timeout = (CONNECT_S, None if streamed else answer_s(method))
        return self._rest.request(method, url, headers=self._headers(), body=body, _request_timeout=timeout)

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
        """The decoded JSON answer (None when empty); ApiException for a non-2xx answer."""
        resp = self._send(method, path, query, body)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise self.api_exception(http_resp=resp)
        return json.loads(data) if data else None

    def text(self, path: str, query: dict[str, Any] | None = None) -> str:
        resp = self._send("GET", path, query)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise self.api_exception(http_resp=resp)
        return (data or b"").decode("utf-8", "replace")

    def lines(self, path: str, query: dict[str, Any] | None = None) -> Iterator[str]:
        """A streamed answer line by line as it arrives (no read timeout: a quiet stream is legal)."""
        resp = self._send("GET", path, query, streamed=True)
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
    cfg = _kubernetes().client.Configuration(host=host)
    if token:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    return KubeClient(cfg)


# -- kubeconfig -----------------------------------------------------------------------------------


class KubeconfigError(Exception):
    """The kubeconfig cannot be used: missing, unreadable, not a kubeconfig, or the context is not in it."""


def load(kubeconfig: str | None, context: str | None) -> KubeClient | None:
    """A client from the kubeconfig (--kubeconfig, else $KUBECONFIG's files merged, else
    ~/.kube/config), or None when there is none."""
    paths = [kubeconfig] if kubeconfig else (os.environ.get("KUBECONFIG") or "").split(os.pathsep)
    paths = [str(Path(p).expanduser()) for p in paths if p] or [str(Path.home() / ".kube" / "config")]
    found = [p for p in paths if Path(p).is_file()]
    if not found:
        if kubeconfig:
            raise KubeconfigError(f"{paths[0]} does not exist")
        return None
    where = os.pathsep.join(found)
    kubernetes = _kubernetes()
    import yaml  # with kubernetes, which reads the file with it: the CLI's flags import this module

    kube_config = kubernetes.config.kube_config
    cfg = kubernetes.client.Configuration()
    try:
        merged = kube_config.KubeConfigMerger(where).config  # every file, merged as kubectl does
        name = context or merged.safe_get("current-context")
        if not name:
            raise KubeconfigError(f"{where}: no current-context in it: pass --context (kubectl config get-contexts)")
        if merged["contexts"].get_with_name(name, safe=True) is None:
            raise KubeconfigError(f"{where}: no context {name!r} in it (kubectl config get-contexts)")
        # config_base_path=None: each file's relative paths are relative to that file
        loader = kube_config.KubeConfigLoader(config_dict=merged, active_context=name, config_base_path=None)
        loader.load_and_set(cfg)
    except (kubernetes.config.ConfigException, OSError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"{where}: {exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a YAML document of another shape
        raise KubeconfigError(f"{where} is not a valid kubeconfig ({type(exc).__name__}: {exc})") from None
    return KubeClient(cfg, (loader.current_context.get("context") or {}).get("namespace"))


def in_cluster() -> KubeClient | None:
    """The pod's service account client (as kubectl does without a kubeconfig), None outside a pod."""
    kubernetes = _kubernetes()
    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        return None
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as fh:
            namespace = fh.read().strip() or None
    except OSError:
        namespace = None
    return KubeClient(cfg, namespace)
