"""Helpers for the `apiserver` test tier: tests against a real kube-apiserver.

The server comes from `k8s/apiserver/up.sh` (a kube-apiserver v1.20.2 + etcd on loopback with
the PyTorchJob, TrainJob and JobSet CRDs installed), or from any cluster whose kubeconfig is in DIST_JOBS_KUBECONFIG.
Tests import this module (pytest puts tests/ on sys.path) and skip when no server answers:

    import pytest
    import apiserver_tier

    pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

    @pytest.fixture(scope="module")
    def api_client():
        return apiserver_tier.kube_client()       # skips with a reason naming up.sh

`kubernetes` is imported lazily so collecting tests never needs it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

UP_SCRIPT = "k8s/apiserver/up.sh"
PYTORCHJOB_CRD = "pytorchjobs.kubeflow.org"
_PROBE_TIMEOUT_S = 3


def state_dir() -> Path:
    """Where up.sh keeps kubeconfig, pids and logs (same default rule as up.sh/down.sh)."""
    explicit = os.environ.get("DIST_JOBS_APISERVER_STATE")
    if explicit:
        return Path(explicit)
    if os.access("/run", os.W_OK):
        return Path("/run/dist-jobs-apiserver")
    return Path(os.environ.get("XDG_RUNTIME_DIR", "/tmp")) / f"dist-jobs-apiserver-{os.getuid()}"


def _candidate() -> Path | None:
    explicit = os.environ.get("DIST_JOBS_KUBECONFIG")
    if explicit:
        return Path(explicit)
    default = state_dir() / "kubeconfig"
    return default if default.is_file() else None


def _new_client(kubeconfig: Path) -> ApiClient:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


@functools.cache
def _probe(kubeconfig: Path) -> str | None:
    """None when the server behind `kubeconfig` answers /version, else why not (cached per run)."""
    if not kubeconfig.is_file():
        return f"kubeconfig {kubeconfig} does not exist"
    try:
        from kubernetes import client
    except ImportError:
        return "the 'kubernetes' python client is not installed (pip install -e '.[dev]')"
    try:
        with _new_client(kubeconfig) as api:
            client.VersionApi(api).get_code(_request_timeout=_PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure (refused, TLS, auth, bad file) means "not usable"
        return f"no kube-apiserver answers for {kubeconfig}: {type(exc).__name__}: {exc}"[:300]
    return None


def kubeconfig_path() -> Path | None:
    """The kubeconfig of a kube-apiserver that answers right now, or None.

    DIST_JOBS_KUBECONFIG wins; otherwise the one up.sh wrote into its state dir.
    """
    candidate = _candidate()
    if candidate is None or _probe(candidate) is not None:
        return None
    return candidate


def skip_reason() -> str:
    candidate = _candidate()
    hint = f"run {UP_SCRIPT} (builds/caches kube-apiserver v1.20.2 once, ~10 min) or set DIST_JOBS_KUBECONFIG"
    if candidate is None:
        return f"no real kube-apiserver: {state_dir() / 'kubeconfig'} missing and DIST_JOBS_KUBECONFIG unset; {hint}"
    return f"{_probe(candidate)}; {hint}"


@functools.cache
def _crd_missing(kubeconfig: Path, crd_name: str) -> str | None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with _new_client(kubeconfig) as api:
        try:
            client.ApiextensionsV1Api(api).read_custom_resource_definition(
                crd_name, _preload_content=False, _request_timeout=_PROBE_TIMEOUT_S
            )
        except ApiException as exc:
            return f"CRD {crd_name} not installed (HTTP {exc.status}); run {UP_SCRIPT}, which installs it"
    return None


def require_apiserver(crd: str | None = PYTORCHJOB_CRD) -> Path:
    """Return the kubeconfig of a live apiserver, or pytest.skip with a reason naming up.sh.

    With `crd` (default: the PyTorchJob CRD) also skip unless that CRD is installed.
    """
    from support import tiers

    tiers.check(("apiserver",))
    kubeconfig = kubeconfig_path()
    assert kubeconfig is not None
    if crd is not None:
        missing = _crd_missing(kubeconfig, crd)
        if missing:
            if tiers.in_ci():
                pytest.fail(f"the apiserver tier is incomplete under CI: {missing}", pytrace=False)
            pytest.skip(missing)
    return kubeconfig


def kube_client(crd: str | None = PYTORCHJOB_CRD) -> ApiClient:
    """A `kubernetes.client.ApiClient` configured for the live apiserver (skips when none).

    The caller owns it: close it (`with kube_client() as api:` or a fixture that yields).
    """
    return _new_client(require_apiserver(crd))


def status_body(exc: Any) -> dict[str, Any]:
    """The JSON Status of a kubernetes ApiException ({} when the body is not JSON, e.g. a 404
    for an uninstalled CRD is plain text)."""
    import json

    try:
        body = json.loads(exc.body or "")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
