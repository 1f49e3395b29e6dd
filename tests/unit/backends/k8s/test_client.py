"""dist_jobs.backends.k8s.client: kubeconfigs read by the official loader give the right host,
namespace and credentials, bad ones a KubeconfigError, and `kubernetes` is imported the ordinary way."""

from __future__ import annotations

import ast
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.backends.k8s import client as k8s_client
from dist_jobs.errors import BackendError
from support.paths import PYTHON, REPO
from support.tiers import require_module

kubernetes = require_module("kubernetes")

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


def _kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], namespace: str | None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}, {"name": "other", "cluster": {"server": "https://x:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": context}, {"name": "second", "context": {"cluster": "other"}}],
        "current-context": "main",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _settings(client: k8s_client.KubeClient | None) -> dict[str, Any]:
    assert client is not None
    cfg = client.configuration
    files = {k: Path(v).read_bytes() if v else None for k, v in (("ca", cfg.ssl_ca_cert), ("cert", cfg.cert_file))}
    return {
        "host": cfg.host,
        "verify": cfg.verify_ssl,
        "auth": client._headers().get("authorization"),
        "namespace": client.namespace,
        **files,
    }


def test_a_token_kubeconfig_gives_host_auth_ca_and_the_context_namespace(tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:6443/", "certificate-authority-data": CA}
    got = _settings(k8s_client.load(str(_kubeconfig(tmp_path, cluster, {"token": "abc"}, "ml")), None))
    assert got == {
        "host": "https://127.0.0.1:6443",
        "verify": True,
        "auth": "Bearer abc",
        "namespace": "ml",
        "ca": base64.b64decode(CA),
        "cert": None,
    }


def test_a_client_certificate_kubeconfig_gives_the_certificate_files(tmp_path: Path) -> None:
    user = {"client-certificate-data": CA, "client-key-data": CA}
    client = k8s_client.load(str(_kubeconfig(tmp_path, {"server": "https://k:443"}, user, "team")), None)
    got = _settings(client)
    assert got["cert"] == base64.b64decode(CA) and got["auth"] is None and got["namespace"] == "team"
    assert client is not None and Path(client.configuration.key_file).read_bytes() == base64.b64decode(CA)


def test_insecure_skip_tls_verify_turns_verification_off(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://k:443", "insecure-skip-tls-verify": True}, {}, None)
    got = _settings(k8s_client.load(str(path), None))
    assert got["verify"] is False and got["namespace"] is None and got["auth"] is None


def test_a_token_file_is_relative_to_the_kubeconfig_and_trimmed(tmp_path: Path) -> None:
    (tmp_path / "token.txt").write_text("from-a-file\n")  # client-go trims it; a newline breaks the header
    path = _kubeconfig(tmp_path, {"server": "http://127.0.0.1:8080"}, {"tokenFile": "token.txt"}, None)
    assert _settings(k8s_client.load(str(path), None))["auth"] == "Bearer from-a-file"


def test_the_context_picks_the_cluster(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://k:443"}, {"token": "abc"}, "ml")
    got = _settings(k8s_client.load(str(path), "second"))
    assert got["host"] == "https://x:1" and got["namespace"] is None


def test_kubeconfig_files_in_the_environment_are_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    first = _kubeconfig(tmp_path / "a", {"server": "https://k:443"}, {"token": "abc"}, "ml")
    second = tmp_path / "b.yaml"
    second.write_text(yaml.safe_dump({"contexts": [{"name": "extra", "context": {"cluster": "c", "namespace": "x"}}]}))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent"), str(first), str(second)]))
    assert _settings(k8s_client.load(None, "extra"))["namespace"] == "x"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert k8s_client.load(None, None) is None  # no kubeconfig at all: the caller tries the pod's service account


def test_a_missing_context_or_file_is_a_kubeconfig_error(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://k:1"}, {}, None)
    with pytest.raises(k8s_client.KubeconfigError, match="no context 'nope'"):
        k8s_client.load(str(path), "nope")
    with pytest.raises(k8s_client.KubeconfigError, match="does not exist"):
        k8s_client.load(str(tmp_path / "absent"), None)


@pytest.mark.parametrize("text", ["apiVersion: [\n", "clusters: 5\n", "- a\n", "\n", "kind: Config\n"])
def test_a_file_that_is_no_kubeconfig_is_a_kubeconfig_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "kubeconfig").write_text(text)
    with pytest.raises(k8s_client.KubeconfigError, match=str(tmp_path / "kubeconfig")):
        k8s_client.load(str(tmp_path / "kubeconfig"), None)


def test_nothing_in_dist_jobs_assigns_into_sys_modules() -> None:
    found = []
    for path in (REPO / "dist_jobs").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                targets = [node.func.value] if node.func.attr in ("update", "setdefault", "__setitem__") else []
            found += [f"{path}:{node.lineno}" for t in targets if "sys.modules" in ast.unparse(t)]
    assert not found, found


PROBE = """
import json, sys
from dist_jobs.backends.k8s import client as k8s_client
from dist_jobs.errors import BackendError
client = k8s_client.for_host("http://127.0.0.1:1")
import kubernetes
from kubernetes import config
print(json.dumps({"version": kubernetes.__version__, "getattr": "__getattr__" in vars(kubernetes),
                  "config": hasattr(config, "load_kube_config"), "file": kubernetes.__file__}))
"""


def test_kubernetes_imported_after_a_client_is_the_ordinary_package() -> None:
    out = subprocess.run([PYTHON, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True).stdout
    got = json.loads(out)
    assert got == {"version": kubernetes.__version__, "getattr": False, "config": True, "file": kubernetes.__file__}


def test_a_missing_kubernetes_package_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # what `import kubernetes` finds when it is absent
    with pytest.raises(BackendError, match="needs the 'kubernetes' package") as err:
        k8s_client.for_host("http://127.0.0.1:1")
    assert err.value.hint == "pip install 'dist-jobs[k8s]'"
