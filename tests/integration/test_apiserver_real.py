"""The real kube-apiserver tier (k8s/apiserver/up.sh): kubectl apply of every rendered example,
`dist-jobs submit/status/cancel` of a PyTorchJob and submit/status/logs/cancel of a TrainJob against a
real v1.20.2 apiserver (patched for kubernetes#99804) with the PyTorchJob, TrainJob and JobSet CRDs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import apiserver_tier, tiers
from support.paths import PYTHON, REPO
from support.tiers import requires
from support.waiting import HUNG_S

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
    """The example in the `default` namespace under a unique name (the tier has no other namespaces),
    with what follows the job (its pods' ServiceAccount, Role and RoleBinding) renamed with it."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    old = docs[0]["metadata"]["name"]
    text = re.sub(rf"\b{re.escape(old)}\b", f"{old[:40]}-{uuid.uuid4().hex[:6]}", yaml.safe_dump_all(docs))
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        doc["metadata"]["namespace"] = "default"
        for subject in doc.get("subjects") or []:
            subject["namespace"] = "default"
    out = tmp_path / path.name
    out.write_text(yaml.safe_dump_all(docs))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_kubectl_apply_rendered_example(kubeconfig: Path, example: Path, tmp_path: Path) -> None:
    manifest = _namespaced(example, tmp_path)
    kc = [kubectl(), "--kubeconfig", str(kubeconfig)]
    applied = subprocess.run([*kc, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=HUNG_S)
    assert applied.returncode == 0, applied.stderr
    assert "created" in applied.stdout or "configured" in applied.stdout
    want, *owned = yaml.safe_load_all(manifest.read_text())
    name = want["metadata"]["name"]
    got = subprocess.run([*kc, "get", "pytorchjob", name, "-o", "yaml"], capture_output=True, text=True, timeout=HUNG_S)
    assert got.returncode == 0, got.stderr
    stored = yaml.safe_load(got.stdout)
    assert stored["spec"]["pytorchReplicaSpecs"].keys() == want["spec"]["pytorchReplicaSpecs"].keys()
    for obj in owned:  # the pods' account, Role and RoleBinding: applied too, the Role naming the job alone
        kind, oname = obj["kind"].lower(), obj["metadata"]["name"]
        found = subprocess.run([*kc, "get", kind, oname, "-o", "yaml"], capture_output=True, text=True, timeout=HUNG_S)
        assert found.returncode == 0, found.stderr
        if kind == "role":
            assert yaml.safe_load(found.stdout)["rules"][0]["resourceNames"] == [name]
    subprocess.run([*kc, "delete", "-f", str(manifest)], capture_output=True, timeout=HUNG_S, check=True)


def test_pvc_example_is_a_valid_readwritemany_claim(kubeconfig: Path, tmp_path: Path) -> None:
    """k8s/pvc-example.yaml through the real apiserver's own validation of core objects."""
    manifest = _namespaced(REPO / "k8s" / "pvc-example.yaml", tmp_path)
    kc = [kubectl(), "--kubeconfig", str(kubeconfig)]
    applied = subprocess.run([*kc, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=HUNG_S)
    assert applied.returncode == 0, applied.stderr
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    got = subprocess.run([*kc, "get", "pvc", name, "-o", "yaml"], capture_output=True, text=True, timeout=HUNG_S)
    assert yaml.safe_load(got.stdout)["spec"]["accessModes"] == ["ReadWriteMany"]
    subprocess.run([*kc, "delete", "pvc", name, "--wait=false"], capture_output=True, timeout=HUNG_S, check=True)


def dj(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "dist_jobs", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=HUNG_S,
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
    from dist_jobs.backends.k8s.backend import K8sBackend
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
        backend.schedule(Prepared("k8s", spec, yaml.safe_dump(doc), "x.yaml"))
    text = str(err.value)
    assert "422" in text and "replicas" in text and "memory" in text


TRAINJOB_CRD = "trainjobs.trainer.kubeflow.org"


def _core(kubeconfig: Path) -> Any:
    from kubernetes import client

    return client.CoreV1Api(apiserver_tier.kube_client())


def _pending_pod(core: Any, name: str, labels: dict[str, str], annotations: dict[str, str], container: str) -> None:
    """A pod as the operator (or JobSet) would create it; with no scheduler here it stays Pending."""
    from kubernetes.client.rest import ApiException

    try:  # the ServiceAccount admission plugin needs the namespace's default account (no controller makes it here)
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
    except ApiException as exc:
        assert exc.status == 409, exc.body
    meta = {"name": name, "labels": labels, "annotations": annotations}
    # no token controller runs here: a pod that mounted the account's token would wait for one forever
    spec = {"automountServiceAccountToken": False, "containers": [{"name": container, "image": "i:1"}]}
    core.create_namespaced_pod("default", {"metadata": meta, "spec": spec})


def test_empty_strings_are_legal_values(kubeconfig: Path, tmp_path: Path) -> None:
    """kubernetes#99804 (v1.20 built with Go >= 1.16 read "" as null) is patched in the tier's build."""
    name = f"empty-{uuid.uuid4().hex[:6]}"
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "procs_per_node": 1, "image": "i:1", "env": {"EMPTY": ""}}))
    sub = dj(kubeconfig, "submit", "--backend", "k8s", str(spec), "--namespace", "default", "--set", "k8s.labels.team=")
    assert sub.returncode == 0, sub.stderr
    from kubernetes import client

    with apiserver_tier.kube_client() as api:
        stored = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", name
        )
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", name
        )
    template = stored["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert {"name": "EMPTY", "value": ""} in template["spec"]["containers"][0]["env"]
    assert template["metadata"]["labels"]["team"] == ""


def test_trainjob_submit_status_logs_cancel(kubeconfig: Path) -> None:
    apiserver_tier.require_apiserver(TRAINJOB_CRD)
    name = f"tj-{uuid.uuid4().hex[:8]}"
    common = ["--backend", "k8s", str(REPO / "k8s/examples/trainjob.yaml"), "--name", name, "--namespace", "default"]
    sub = dj(kubeconfig, "submit", *common)
    assert (sub.returncode, sub.stdout.strip()) == (0, f"k8s://default/TrainJob/{name}"), sub.stderr  # a handle
    try:
        _trainjob_verbs(kubeconfig, name)
    finally:
        _forget(name)


def _trainjob_verbs(kubeconfig: Path, name: str) -> None:
    ns = ["--namespace", "default"]
    status = dj(kubeconfig, "status", "--backend", "k8s", name, *ns)
    assert status.returncode == 1 and "not found" in status.stderr  # a PyTorchJob unless --kind says otherwise
    tj = ["--backend", "k8s", "--kind", "TrainJob", *ns]
    status = dj(kubeconfig, "status", *tj, "-o", "json", name)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "pending" and name in json.loads(status.stdout)["handle"]
    by_handle = dj(kubeconfig, "status", "-o", "json", f"k8s://default/TrainJob/{name}")  # the kind travels with it
    assert by_handle.returncode == 0 and json.loads(by_handle.stdout)["state"] == "pending", by_handle.stderr
    listed = dj(kubeconfig, "list", *tj)
    assert name in listed.stdout.split(), listed.stderr
    from dist_jobs.backends.k8s.backend import K8sBackend

    stored = K8sBackend(namespace="default", kubeconfig=str(kubeconfig), kind="TrainJob")._get(name)
    (patch,) = stored["spec"]["runtimePatches"]  # the CRD keeps every setting dist-jobs carries there
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["spec"]["volumes"][1]["persistentVolumeClaim"] == {"claimName": "shared-checkpoints"}
    assert len(pod["metadata"]["annotations"]["dist-jobs/submission"]) == 12
    logs = dj(kubeconfig, "logs", *tj, name)
    assert logs.returncode == 1 and "has no pod with rank 0 (its pods: none yet)" in logs.stderr
    core = _core(kubeconfig)
    labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node"}
    _pending_pod(core, f"{name}-node-0-0-abcde", labels, {"batch.kubernetes.io/job-completion-index": "0"}, "node")
    try:
        logs = dj(kubeconfig, "logs", *tj, name)  # the apiserver itself answers an unscheduled pod's log with nothing
        assert logs.returncode == 1 and f"pod {name}-node-0-0-abcde is Pending: it has no log yet" in logs.stderr
    finally:
        core.delete_namespaced_pod(f"{name}-node-0-0-abcde", "default", grace_period_seconds=0)
    cancel = dj(kubeconfig, "cancel", *tj, name)
    assert cancel.returncode == 0, cancel.stderr


def _forget(name: str) -> None:
    """cancel deletes in the foreground, and no garbage collector runs here to finish it."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    args = ("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", name)
    with apiserver_tier.kube_client() as api:
        custom = client.CustomObjectsApi(api)
        try:
            custom.patch_namespaced_custom_object(*args, {"metadata": {"finalizers": None}})
            custom.delete_namespaced_custom_object(*args)  # when cancel did not get that far
        except ApiException as exc:
            assert exc.status == 404, exc.body


def test_a_missing_namespace_says_to_create_it(kubeconfig: Path) -> None:
    namespace = f"absent-{uuid.uuid4().hex[:6]}"
    common = ["--backend", "k8s", str(REPO / "k8s/examples/resnet-2x4.yaml"), "--namespace", namespace]
    sub = dj(kubeconfig, "submit", *common)
    assert sub.returncode == 1 and f'namespaces "{namespace}" not found (404 NotFound)' in sub.stderr
    assert f"kubectl create namespace {namespace}" in sub.stderr and "Traceback" not in sub.stderr


@requires("pods")
@pytest.mark.timeout(400)
def test_a_hung_rank_through_the_real_apiserver_and_the_operator_harness(
    kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dist-jobs submit` to the real apiserver; the operator harness plays the stored PyTorchJob.
    Rank 1 stops stepping at its 7th batch once (support/hang_support.py): every rank's watchdog
    dumps its stacks, both pods exit 200 and are recreated, the gang resumes from the checkpoint
    and finishes; `dist-jobs status` against the apiserver shows the finished progress of the
    second attempt, read from the run directory the pods were given.
    Slow by nature: the ranks must sit stalled until the watchdog's limit runs out (its 5 s floor, or 10
    times the recent step time if longer) and dump their stacks; then both pods are recreated and the job runs a
    second time, starting torch in every rank again."""
    from kubernetes import client

    from support.operator_harness import Operator
    from support.paths import TESTS

    name = f"hang-{uuid.uuid4().hex[:8]}"
    train = {"image_size": 8, "fake_samples": 512, "epochs": 1, "batch_size": 8, "eval_every_epoch": False}
    train.update(model="support.hang_support:stalling_net", hang_min_seconds=5, hang_factor=10, log_every=1)
    spec = {
        "name": name,
        "nodes": 2,
        "procs_per_node": 2,
        "checkpoint_dir": "ckpt",
        "image": "local/dist-jobs:test",
        "env": {
            "DIST_JOBS_RDZV_TIMEOUT": "60",
            "DJ_TEST_HANG_MARKER": str(tmp_path / "stalled"),
            "DJ_TEST_HANG_STEP": "7",
        },
        "train": {**train, "checkpoint_every_steps": 2},
        "k8s": {"pvc": "shared", "mount_path": str(tmp_path / "shared"), "namespace": "default"},
    }
    path = tmp_path / "hang.yaml"
    path.write_text(yaml.safe_dump(spec))
    sub = dj(kubeconfig, "submit", "--backend", "k8s", str(path))
    assert sub.returncode == 0, sub.stderr
    handle = sub.stdout.strip()
    with apiserver_tier.kube_client() as api:
        stored = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "kubeflow.org", "v1", "default", "pytorchjobs", name
        )
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{TESTS}")  # the image's python path: the harness passes it on
    (tmp_path / "logs").mkdir()
    try:
        with Operator(stored, tmp_path / "logs") as operator:
            phase = operator.finish(timeout=300)
        assert phase == "Succeeded", [a.text()[-3000:] for a in operator.attempts]
        codes = sorted((a.pod.rsplit("-", 2)[-2], a.number, a.code) for a in operator.attempts)
        assert codes == [("master", 0, 200), ("master", 1, 0), ("worker", 0, 200), ("worker", 1, 0)]
        first = "".join(a.text() for a in operator.attempts if a.number == 0)
        assert "hang_support: rank 1 stops stepping at batch 7" in first and "in stop_stepping" in first
        for rank in range(4):
            assert f"rank {rank}: hang watchdog: no optimizer step completed for" in first, first[-4000:]
            assert f"dist-jobs: rank {rank}: end of the stacks" in first, first[-4000:]
        # Each rank's dump is written whole: the two ranks of a pod share its log, not their lines
        # (torchrun prefixes each with its rank, PET_LOG_LINE_PREFIX_TEMPLATE: consecutive lines, one rank).
        whole = r"^\[rank (\d+)\] .*\(most recent call first\):\n\[rank \1\]   File "
        assert re.search(whole, first, re.M), first[-4000:]
        assert re.search(r"^\[rank \d+\] Thread 0x", first, re.M), first[-4000:]
        shown = dj(kubeconfig, "status", "-o", "json", handle)
        assert shown.returncode == 0, shown.stderr
        progress = json.loads(shown.stdout)["progress"]
        assert (progress["step"], progress["state"], progress["attempt"]) == (16, "finished", 1), progress
        table = dj(kubeconfig, "status", handle)
        assert "  progress: step 16/16 (100%) epoch 0  " in table.stdout, table.stdout
    finally:
        dj(kubeconfig, "cancel", handle)
        _drop_finalizers(kubeconfig, name)


def test_a_snapshot_is_a_configmap_owned_by_its_job(kubeconfig: Path, tmp_path: Path) -> None:
    """submit --snapshot: the real apiserver takes the job and then its code ConfigMap, which
    names the job (its uid) as owner, so the garbage collector removes it with the job."""
    from kubernetes import client

    name = f"snap-{uuid.uuid4().hex[:8]}"
    (tmp_path / "train.py").write_text("print('submitted')\n")
    argv = ["submit", "--backend", "k8s", "--name", name, "--namespace", "default", "--image", "x/y:1"]
    argv += ["--procs-per-node", "1", "--snapshot", "--kubeconfig", str(kubeconfig), "--", "python3", "train.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [PYTHON, "-m", "dist_jobs", *argv]
    dry = subprocess.run(
        [*run[:4], "--dry-run", *run[4:]], capture_output=True, text=True, timeout=HUNG_S, cwd=tmp_path, env=env
    )
    assert dry.returncode == 0 and "accepted by the apiserver" in dry.stderr, dry.stderr
    sub = subprocess.run(run, capture_output=True, text=True, timeout=HUNG_S, cwd=tmp_path, env=env)
    assert sub.returncode == 0, sub.stderr
    try:
        with apiserver_tier.kube_client() as api:
            job = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "kubeflow.org", "v1", "default", "pytorchjobs", name
            )
            code = client.CoreV1Api(api).read_namespaced_config_map(f"{name}-code", "default")
        owner = code.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid) == ("PyTorchJob", name, job["metadata"]["uid"])
        assert set(code.binary_data) == {"code.tar.gz"}
        volumes = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"]
        assert {"name": "dist-jobs-snapshot", "configMap": {"name": f"{name}-code"}} in volumes
        shown = dj(kubeconfig, "status", "-o", "json", sub.stdout.strip())
        assert json.loads(shown.stdout)["extra"]["code"] == f"snapshot (no git commit) in ConfigMap {name}-code"
    finally:
        dj(kubeconfig, "cancel", "--backend", "k8s", name, "--namespace", "default")
        _drop_finalizers(kubeconfig, name)
        with apiserver_tier.kube_client() as api, contextlib.suppress(client.ApiException):
            client.CoreV1Api(api).delete_namespaced_config_map(f"{name}-code", "default")  # no garbage collector here
