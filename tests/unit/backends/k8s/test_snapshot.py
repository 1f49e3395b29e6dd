"""`snapshot: true` on Kubernetes (dist_jobs.backends.k8s.code): render stays pure and mounts the
job's code ConfigMap; the dry run (prepare) appends that ConfigMap, the code as on disk in a
gzipped tar; too much code is refused naming the size, the limit and the fix; the pod entrypoint
unpacks the code and runs the program from it, on every start of the pod."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.render import render
from dist_jobs.spec.load import load_spec
from support.git_project import git, make_project
from support.k8s_offline.validate import prune_and_default
from support.paths import PYTHON, REPO
from support.render_helpers import run_pod_entrypoint
from support.tiers import require_module
from support.waiting import HUNG_S

require_module("kubernetes")

SPEC = {"name": "snap", "procs_per_node": 1, "image": "x/y:1", "snapshot": True, "command": ["python3", "train.py"]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(
        tmp_path / "proj",
        {"train.py": "print('committed version')\n", "pkg/model.py": "X = 1\n", ".gitignore": "data/\n"},
        # train.py uncommitted: the pods get it as on disk
        {"train.py": "print('submitted version')\n", "data/big.bin": os.urandom(4096)},
    )


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    replicas = doc["spec"]["pytorchReplicaSpecs"].values()
    return [c for r in replicas for c in r["template"]["spec"]["containers"]]


@pytest.mark.parametrize("nodes", [1, 3])
def test_render_is_pure_and_every_replica_mounts_the_code_configmap(nodes: int) -> None:
    text = render(load_spec(data={**SPEC, "nodes": nodes}), "k8s")
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert len(docs) == 1  # the ConfigMap's data is the code: only prepare (the dry run) reads it
    assert "# snapshot: the pods run the code in ConfigMap snap-code" in text
    stored, unknown = prune_and_default(docs[0])
    assert unknown == []  # the operator's CRD keeps every field
    for replica in stored["spec"]["pytorchReplicaSpecs"].values():
        volumes = {v["name"]: v for v in replica["template"]["spec"]["volumes"]}
        assert volumes["dist-jobs-snapshot"] == {"name": "dist-jobs-snapshot", "configMap": {"name": "snap-code"}}
        assert volumes["dist-jobs-code"]["emptyDir"] == {}
    for container in containers(stored):
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["dist-jobs-snapshot"] == {
            "name": "dist-jobs-snapshot",
            "mountPath": "/dist-jobs/snapshot",
            "readOnly": True,
        }
        assert mounts["dist-jobs-code"]["mountPath"] == "/dist-jobs/code"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["DIST_JOBS_SNAPSHOT"] == "/dist-jobs/snapshot/code.tar.gz"
    plain = yaml.safe_load(render(load_spec(data={**SPEC, "snapshot": None}), "k8s"))
    assert "dist-jobs-snapshot" not in json.dumps(plain) and "tarfile" not in json.dumps(plain)
    assert all("DIST_JOBS_SNAPSHOT" not in [e["name"] for e in c["env"]] for c in containers(plain))


def test_a_trainjob_carries_the_code_volumes_to_its_node_pods() -> None:
    doc = yaml.safe_load(render(load_spec(data={**SPEC, "k8s": {"api": "trainjob"}}), "k8s"))
    stored, unknown = prune_and_default(doc)
    assert unknown == []
    step = stored["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = step["template"]["spec"]["template"]["spec"]
    assert {"name": "dist-jobs-snapshot", "configMap": {"name": "snap-code"}} in pod["volumes"]
    assert "dist-jobs-code" in [m["name"] for m in pod["containers"][0]["volumeMounts"]]


def dry_run(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-m", "dist_jobs", "submit", "--dry-run", "--backend", "k8s", "--name", "snap", "--image", "x/y:1"]
    argv += ["--procs-per-node", "1", *flags, "--", "python3", "train.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(cwd / "no-kubeconfig")}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=HUNG_S)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".git" not in p.parts)


def test_the_dry_run_appends_the_configmap_with_the_code_as_on_disk(project: Path) -> None:
    before = files_under(project)
    proc = dry_run(project, "--snapshot")
    assert proc.returncode == 0, proc.stderr
    assert files_under(project) == before  # the dry run writes nothing
    job, *owned, code = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert job["kind"] == "PyTorchJob" and (code["kind"], code["metadata"]["name"]) == ("ConfigMap", "snap-code")
    assert [d["kind"] for d in owned] == ["ServiceAccount", "Role", "RoleBinding"]  # the pods' (render.k8s)
    head = git(project, "rev-parse", "HEAD").strip()
    assert code["metadata"]["annotations"]["dist-jobs/commit"] == head
    assert code["metadata"]["annotations"]["dist-jobs/dirty"] == "true"
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(code["binaryData"]["code.tar.gz"]))) as tar:
        names = sorted(tar.getnames())
        assert names == [".gitignore", "SNAPSHOT.json", "pkg/model.py", "train.py"]  # data/ is ignored
        assert tar.extractfile("train.py").read() == b"print('submitted version')\n"  # type: ignore[union-attr]
        record = json.loads(tar.extractfile("SNAPSHOT.json").read())  # type: ignore[union-attr]
    assert (record["commit"], record["dirty"], record["dir"]) == (head, True, "/dist-jobs/code")
    without = [d for d in yaml.safe_load_all(dry_run(project).stdout) if d]
    assert [d["kind"] for d in without] == ["PyTorchJob", "ServiceAccount", "Role", "RoleBinding"]


def test_more_code_than_a_configmap_holds_is_refused_with_the_size_the_limit_and_the_fix(project: Path) -> None:
    (project / "weights.bin").write_bytes(os.urandom(3 * 2**20 // 2))  # not ignored, incompressible
    proc = dry_run(project, "--snapshot")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "snapshot: the code in" in proc.stderr and "is 1.5 MiB compressed" in proc.stderr
    assert "more than the 1 MiB a Kubernetes ConfigMap holds" in proc.stderr
    assert "build an image with the code" in proc.stderr and ".gitignore" in proc.stderr


def run_pod(tmp_path: Path, blob: bytes) -> subprocess.CompletedProcess[str]:
    """The pod entrypoint of SPEC as the container runs it (the kubelet's `$$` undone), with the
    ConfigMap's tar at DIST_JOBS_SNAPSHOT and an empty folder as the pod's code folder."""
    (tmp_path / "snapshot").mkdir(exist_ok=True)
    (tmp_path / "snapshot" / "code.tar.gz").write_bytes(blob)
    (tmp_path / "code").mkdir(exist_ok=True)
    env = {
        "DIST_JOBS_SNAPSHOT": str(tmp_path / "snapshot" / "code.tar.gz"),
        "DIST_JOBS_CODE_DIR": str(tmp_path / "code"),
    }
    return run_pod_entrypoint(SPEC, "pwd; python3 train.py", tmp_path / "shared", env, cwd=tmp_path)


def test_the_pod_entrypoint_runs_the_program_in_the_unpacked_code_on_every_start(project: Path, tmp_path: Path) -> None:
    from dist_jobs.backends.k8s.code import pack

    blob, _ = pack(project)
    (project / "train.py").write_text("print('edited after submit')\n")
    for _start in range(2):  # a restarted container finds the folder filled: the same code again
        proc = run_pod(tmp_path, blob)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[-2:] == [str(tmp_path / "code"), "submitted version"]
    broken = run_pod(tmp_path, b"not a tar")
    assert broken.returncode == 2 and "submitted version" not in broken.stdout


def test_a_job_whose_configmap_cannot_be_made_is_deleted_again(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The account may not create ConfigMaps (403): the ConfigMap create fails after the job's and
    # the pods' account, Role and RoleBinding.
    from dist_jobs.backends.k8s import client as k8s_client
    from dist_jobs.backends.k8s.backend import K8sBackend
    from dist_jobs.errors import BackendError
    from support.k8s_offline.validate import crd_path
    from support.kube_standin import FakeKubeAPI

    monkeypatch.chdir(project)
    with FakeKubeAPI([crd_path("PyTorchJob")]) as api:
        backend = K8sBackend(api_client=k8s_client.for_host(api.url))
        prepared = backend.prepare(load_spec(data=SPEC))
        api.forbidden = {"configmaps"}
        with pytest.raises(BackendError) as caught:
            backend.schedule(prepared)
        assert "create ConfigMap default/snap-code" in caught.value.message
        calls = [(r.method, r.path.rsplit("/", 2)[-2:]) for r in api.requests]
        assert [(m, p[-1] if m == "POST" else p[0]) for m, p in calls] == [
            ("POST", "pytorchjobs"),
            ("POST", "serviceaccounts"),
            ("POST", "roles"),
            ("POST", "rolebindings"),
            ("POST", "configmaps"),
            ("DELETE", "pytorchjobs"),
        ]
        assert api.store == {}  # no job left whose pods would wait for the volume
