"""dist_jobs.backends.k8s.client: the kubeconfig read without the official loader gives the
official loader's connection settings, and `dist-jobs submit` does not import the whole client."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.backends.k8s import client as k8s_client
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


def _settings(client: k8s_client.KubeClient) -> dict[str, Any]:
    cfg = client.configuration
    files = {k: Path(v).read_bytes() if v else None for k, v in (("ca", cfg.ssl_ca_cert), ("cert", cfg.cert_file))}
    return {
        "host": cfg.host,
        "verify": cfg.verify_ssl,
        "auth": client._headers().get("authorization"),
        "namespace": client.namespace,
        **files,
    }


@pytest.mark.parametrize(
    ("cluster", "user", "namespace"),
    [
        ({"server": "https://127.0.0.1:6443", "certificate-authority-data": CA}, {"token": "abc"}, "ml"),
        ({"server": "https://k:443/", "insecure-skip-tls-verify": True}, {}, None),
        (
            {"server": "https://k:443", "certificate-authority-data": CA},
            {"client-certificate-data": CA, "client-key-data": CA},
            "team",
        ),
        ({"server": "http://127.0.0.1:8080"}, {"tokenFile": "token.txt"}, None),
    ],
)
def test_fast_kubeconfig_reading_matches_the_official_loader(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], namespace: str | None
) -> None:
    (tmp_path / "token.txt").write_text("from-a-file")
    path = _kubeconfig(tmp_path, cluster, user, namespace)
    fast = k8s_client.load(str(path), None)
    official = k8s_client._official(str(path), None)
    assert fast is not None and _settings(fast) == _settings(official)
    assert _settings(k8s_client.load(str(path), "second"))["host"] == "https://x:1"
    (tmp_path / "token.txt").write_text("from-a-file\n")  # client-go trims a token file; a newline breaks the header
    assert _settings(k8s_client.load(str(path), None))["auth"] == _settings(fast)["auth"]


def test_other_credentials_go_to_the_official_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://k:1"}, {"exec": {"command": "get-token"}}, None)
    used: list[str | None] = []
    monkeypatch.setattr(k8s_client, "_official", lambda p, c: used.append(p) or "official")
    assert k8s_client.load(str(path), None) == "official" and used == [str(path)]
    monkeypatch.setenv("KUBECONFIG", f"{path}:{path}")
    assert k8s_client.load(None, None) == "official" and used[-1] is None  # several files: merged by it


def test_a_missing_context_or_file_is_a_kubeconfig_error(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://k:1"}, {}, None)
    with pytest.raises(k8s_client.KubeconfigError, match="no context 'nope'"):
        k8s_client.load(str(path), "nope")
    with pytest.raises(k8s_client.KubeconfigError, match="does not exist"):
        k8s_client.load(str(tmp_path / "absent"), None)


PROBE = """
import json, sys
from dist_jobs.backends.k8s import client as k8s_client
client = k8s_client.for_host("http://127.0.0.1:1")
lean = sorted(m for m in sys.modules if m.startswith("kubernetes"))
import kubernetes
version = kubernetes.__version__  # the package's own __init__ runs when something needs it
from kubernetes import config
print(json.dumps({"lean": lean, "version": version, "config": hasattr(config, "load_kube_config")}))
"""


def test_only_the_rest_layer_of_the_client_is_imported() -> None:
    out = subprocess.run([PYTHON, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True).stdout
    got = json.loads(out)
    assert not [m for m in got["lean"] if m.startswith(("kubernetes.config", "kubernetes.watch", "kubernetes.stream"))]
    assert "kubernetes.client.rest" in got["lean"] and "kubernetes.client.api_client" not in got["lean"]
    assert got["version"] == kubernetes.__version__ and got["config"]
