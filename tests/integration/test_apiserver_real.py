"""The real kube-apiserver tier (k8s/apiserver/up.sh): kubectl apply of every rendered example and
`dist-jobs submit/status/cancel` against a real v1.20.2 apiserver with the PyTorchJob CRD."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from support import apiserver_tier, tiers
from support.paths import PYTHON, REPO
from support.tiers import requires

pytestmark = [requires("apiserver"), pytest.mark.slow]

EXAMPLES = sorted((REPO / "k8s" / "examples").glob("*.pytorchjob.yaml"))


@pytest.fixture(scope="module")
def kubeconfig() -> Path:
    return apiserver_tier.require_apiserver()


def kubectl() -> str:
    cached = (
        Path(os.environ.get("DIST_JOBS_CACHE", Path.home() / ".cache" / "dist-jobs"))
        / "kube-apiserver-v1.20.2"
        / "bin"
        / "kubectl"
    )
    found = str(cached) if cached.exists() else shutil.which("kubectl")
    if not found:
        if tiers.in_ci():
            pytest.fail("no kubectl under CI: k8s/apiserver/up.sh caches kubectl 1.20", pytrace=False)
        pytest.skip("no kubectl: k8s/apiserver/up.sh caches kubectl 1.20")
    return found


def _namespaced(path: Path, tmp_path: Path) -> Path:
    """The example in the `default` namespace under a unique name (the tier has no other namespaces)."""
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = "default"
    doc["metadata"]["name"] = f"{doc['metadata']['name'][:40]}-{uuid.uuid4().hex[:6]}"
    out = tmp_path / path.name
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_kubectl_apply_rendered_example(kubeconfig: Path, example: Path, tmp_path: Path) -> None:
    manifest = _namespaced(example, tmp_path)
    kc = [kubectl(), "--kubeconfig", str(kubeconfig)]
    applied = subprocess.run([*kc, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert "created" in applied.stdout or "configured" in applied.stdout
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    got = subprocess.run([*kc, "get", "pytorchjob", name, "-o", "yaml"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    stored = yaml.safe_load(got.stdout)
    want = yaml.safe_load(manifest.read_text())
    assert stored["spec"]["pytorchReplicaSpecs"].keys() == want["spec"]["pytorchReplicaSpecs"].keys()
    subprocess.run([*kc, "delete", "pytorchjob", name], capture_output=True, timeout=60, check=True)


def test_pvc_example_is_a_valid_readwritemany_claim(kubeconfig: Path, tmp_path: Path) -> None:
    """k8s/pvc-example.yaml through the real apiserver's own validation of core objects."""
    manifest = _namespaced(REPO / "k8s" / "pvc-example.yaml", tmp_path)
    kc = [kubectl(), "--kubeconfig", str(kubeconfig)]
    applied = subprocess.run([*kc, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    got = subprocess.run([*kc, "get", "pvc", name, "-o", "yaml"], capture_output=True, text=True, timeout=60)
    assert yaml.safe_load(got.stdout)["spec"]["accessModes"] == ["ReadWriteMany"]
    subprocess.run([*kc, "delete", "pvc", name, "--wait=false"], capture_output=True, timeout=60, check=True)


def dj(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "dist_jobs", *args, "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=120
    )


def test_submit_status_cancel(kubeconfig: Path) -> None:
    name = f"tier-{uuid.uuid4().hex[:8]}"
    common = ["--backend", "k8s", str(REPO / "k8s/examples/resnet-2x4.yaml"), "--name", name, "--namespace", "default"]
    dry = dj(kubeconfig, "submit", *common, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "kind: PyTorchJob" in dry.stdout and "server-side dry run" in dry.stderr
    sub = dj(kubeconfig, "submit", *common)
    assert sub.returncode == 0, sub.stderr
    handle = sub.stdout.strip()
    assert handle == f"k8s://default/PyTorchJob/{name}"
    again = dj(kubeconfig, "submit", *common)
    assert again.returncode == 1 and "409" in again.stderr and "Traceback" not in again.stderr
    status = dj(kubeconfig, "status", "--backend", "k8s", name, "--namespace", "default")
    assert status.returncode == 0, status.stderr
    assert name in status.stdout
    by_handle = dj(kubeconfig, "status", "-o", "json", handle)
    assert by_handle.returncode == 0 and json.loads(by_handle.stdout)["handle"] == handle, by_handle.stderr
    listed = dj(kubeconfig, "list", "--backend", "k8s", "--namespace", "default")
    assert name in listed.stdout
    cancel = dj(kubeconfig, "cancel", "--backend", "k8s", name, "--namespace", "default")
    assert cancel.returncode == 0, cancel.stderr
    _drop_finalizers(kubeconfig, name)


def _drop_finalizers(kubeconfig: Path, name: str) -> None:
    """cancel deletes in the foreground; this tier runs no garbage collector to finish that."""
    from kubernetes import client

    with apiserver_tier.kube_client() as api:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", name, {"metadata": {"finalizers": None}}
        )


def test_invalid_submission_lists_causes(kubeconfig: Path, tmp_path: Path) -> None:
    """The real apiserver's 422: each field cause on its own line, exit 1, no traceback."""
    from dist_jobs.backends.base import Prepared
    from dist_jobs.backends.k8s import K8sBackend
    from dist_jobs.errors import BackendError
    from dist_jobs.render import render
    from dist_jobs.spec.load import load_spec

    spec = load_spec(data={"name": f"bad-{uuid.uuid4().hex[:6]}", "nodes": 2, "procs_per_node": 1, "image": "i:1"})
    doc = yaml.safe_load(render(spec, "k8s"))
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"memory": "lots"}
    }
    backend = K8sBackend(namespace="default", kubeconfig=str(kubeconfig))
    with pytest.raises(BackendError) as err:
        backend.submit(Prepared("k8s", spec, yaml.safe_dump(doc), "x.yaml"))
    text = str(err.value)
    assert "422" in text and "replicas" in text and "memory" in text
