"""Never the same bad node twice on Kubernetes (rundir.node_affinity, rundir.pod_end): the pod whose
rank was killed on a node, its restarts there used up, quarantines the node and patches its
PyTorchJob so that the operator's recreated pods refuse it; the user's own affinity stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dist_jobs.rundir import node_affinity, pod_end
from dist_jobs.rundir.node_affinity import InCluster, avoiding, keep_nodes_off, kept_off
from dist_jobs.rundir.quarantine import Quarantine, active_quarantines
from dist_jobs.rundir.verdict import recorded
from support.k8s_offline.validate import crd_path
from support.kube_standin import FakeKubeAPI, sample_pytorchjob

NS, JOB = "ml", "train"
GPU_TERM = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
H100_TERM = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}


def refusal(*nodes: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_a_refusal_is_added_to_every_term_of_the_users_own_and_removed_without_a_trace() -> None:
    spread = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    spec = {"affinity": {**required(GPU_TERM, H100_TERM), **spread}}
    refused = avoiding(spec, ["n2"])
    terms = refused["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{**GPU_TERM, "matchFields": [refusal("n2")]}, {**H100_TERM, "matchFields": [refusal("n2")]}]
    assert refused["podAntiAffinity"] == spread["podAntiAffinity"] and kept_off({"affinity": refused}) == ["n2"]
    again = avoiding({"affinity": refused}, ["n2", "n3"])  # the whole list, not one more term
    assert kept_off({"affinity": again}) == ["n2", "n3"] and len(str(again)) < len(str(refused)) + 20
    assert avoiding({"affinity": again}, []) == spec["affinity"]


def test_a_template_without_affinity_gets_one_term_and_loses_it_again() -> None:
    assert avoiding({}, ["n1"]) == required({"matchFields": [refusal("n1")]})
    assert avoiding({"affinity": avoiding({}, ["n1"])}, []) == {}
    assert kept_off({}) == []


@pytest.fixture()
def api() -> Any:
    with FakeKubeAPI([crd_path("PyTorchJob")]) as server:
        job = sample_pytorchjob(JOB, NS)
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"] = required(GPU_TERM)
        job["metadata"].update(uid="u1", resourceVersion=server.next_rv())
        server.store[("pytorchjobs", NS, JOB)] = job
        yield server


@pytest.fixture()
def account(tmp_path: Path) -> Path:
    """What the kubelet mounts: the token, the namespace (the CA is only read over https)."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text("tok\n")
    (folder / "namespace").write_text(NS)
    return folder


def templates(api: FakeKubeAPI) -> dict[str, dict[str, Any]]:
    replicas = api.store[("pytorchjobs", NS, JOB)]["spec"]["pytorchReplicaSpecs"]
    return {rtype: r["template"]["spec"] for rtype, r in replicas.items()}


def test_the_job_is_patched_so_that_every_replica_refuses_the_nodes_and_expired_ones_come_back(
    api: FakeKubeAPI, account: Path
) -> None:
    cluster = InCluster(api.url, account)
    records = [Quarantine("n2", "rank 1 killed by SIGKILL", "s1", 0.0, 100.0)]
    assert keep_nodes_off(cluster, JOB, records, now=50.0) == ["n2"]
    specs = templates(api)
    assert kept_off(specs["Master"]) == kept_off(specs["Worker"]) == ["n2"]
    worker_terms = specs["Worker"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert worker_terms["nodeSelectorTerms"] == [{**GPU_TERM, "matchFields": [refusal("n2")]}]
    (patch,) = [r for r in api.requests if r.method == "PATCH"]
    assert patch.content_type == "application/merge-patch+json" and patch.headers["authorization"] == "Bearer tok"
    records.append(Quarantine("n3", "rank 0 killed by SIGKILL", "s1", 60.0, 160.0))
    assert keep_nodes_off(cluster, JOB, records, now=120.0) == ["n3"]  # n2's hour is over
    assert kept_off(templates(api)["Master"]) == ["n3"]


def test_a_patch_that_lost_to_another_pods_patch_reads_the_job_again(api: FakeKubeAPI, account: Path) -> None:
    class Raced(InCluster):
        def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
            if method == "PATCH" and not any(r.method == "PATCH" for r in api.requests):  # another pod's first
                stored = api.store[("pytorchjobs", NS, JOB)]
                stored["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["affinity"] = avoiding({}, ["n1"])
                stored["metadata"]["resourceVersion"] = api.next_rv()
            return super().call(method, path, body)

    records = [Quarantine("n2", "", "s1", 0.0, 100.0)]
    assert keep_nodes_off(Raced(api.url, account), JOB, records, now=1.0) == ["n1", "n2"]
    assert [r.status for r in api.requests if r.method == "PATCH"] == [409, 200]
    assert kept_off(templates(api)["Worker"]) == ["n1", "n2"]


def pod_env(monkeypatch: pytest.MonkeyPatch, root: Path, **extra: str) -> None:
    env = {"DIST_JOBS_CHECKPOINT_DIR": str(root), "DIST_JOBS_RUN": "run", "DIST_JOBS_SUBMISSION": "s1"}
    env |= {"HOSTNAME": "train-worker-0", "DIST_JOBS_NODE": "n2", "DIST_JOBS_K8S_JOB": JOB, **extra}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("DIST_JOBS_LOCK_TOKEN", "DIST_JOBS_LOCK_OWNER"):
        monkeypatch.delenv(name, raising=False)


def test_a_rank_killed_on_a_node_whose_restarts_are_used_up_keeps_the_node_away(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    api: FakeKubeAPI,
    account: Path,
) -> None:
    pod_env(monkeypatch, tmp_path, DIST_JOBS_MAX_RESTARTS="1")
    monkeypatch.setattr(pod_end, "from_env", lambda: (InCluster(api.url, account), JOB))
    (tmp_path / "start").touch()
    run_dir = tmp_path / "run"
    # The first SIGKILL there is restarted (the recreated pod may land on n2 again): nothing patched.
    pod_end.main(["--rc", "137", "--since", str(tmp_path / "start")])
    out = capsys.readouterr()
    assert out.out.strip() == "200" and "restarted in place" in out.err
    assert active_quarantines(run_dir, "s1", 1e12 - 1) == []
    assert kept_off(templates(api)["Worker"]) == [] and not any(r.method == "PATCH" for r in api.requests)
    # The second is the node's: it is quarantined and the job's templates refuse it.
    pod_end.main(["--rc", "137", "--since", str(tmp_path / "start")])
    out = capsys.readouterr()
    assert out.out.strip() == "200"
    assert "the job's pods keep away from n2 (killed by SIGKILL (exit 137) on train-worker-0)" in out.err
    verdicts = recorded(run_dir, "s1")
    assert [(v.ending.value, v.action.value, v.node) for v in verdicts] == [
        ("rank killed", "restart", "n2"),
        ("rank killed", "requeue", "n2"),
    ]
    assert [q.node for q in active_quarantines(run_dir, "s1", verdicts[-1].time)] == ["n2"]
    assert kept_off(templates(api)["Master"]) == kept_off(templates(api)["Worker"]) == ["n2"]


def test_the_programs_own_error_and_a_job_that_does_not_avoid_nodes_patch_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, account: Path
) -> None:
    pod_env(monkeypatch, tmp_path, DIST_JOBS_MAX_RESTARTS="0")
    monkeypatch.setattr(pod_end, "from_env", lambda: (InCluster(api.url, account), JOB))
    (tmp_path / "start").touch()
    pod_end.main(["--rc", "3", "--since", str(tmp_path / "start")])  # a bug: fails, no node is to blame
    assert capsys.readouterr().out.strip() == "3"
    monkeypatch.setattr(pod_end, "from_env", lambda: (InCluster(api.url, account), ""))  # avoid_failed_nodes off
    pod_end.main(["--rc", "137", "--since", str(tmp_path / "start")])
    assert capsys.readouterr().out.strip() == "200"
    assert not any(r.method == "PATCH" for r in api.requests)
    assert active_quarantines(tmp_path / "run", "s1", 1e12 - 1) == []


def test_without_a_service_account_the_node_is_quarantined_and_the_pod_says_it_cannot_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pod_env(monkeypatch, tmp_path, DIST_JOBS_MAX_RESTARTS="0")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(node_affinity, "SERVICE_ACCOUNT", tmp_path / "none")
    (tmp_path / "start").touch()
    pod_end.main(["--rc", "137", "--since", str(tmp_path / "start")])
    out = capsys.readouterr()
    assert out.out.strip() == "200" and "n2 is quarantined, but this pod has no service account token" in out.err


def test_in_cluster_detection_needs_the_service_and_the_token(tmp_path: Path, account: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert InCluster.detect(env, account) == InCluster("https://10.96.0.1:443", account)
    assert InCluster.detect({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account).url == "https://[fd00::1]:443"  # type: ignore[union-attr]
    assert InCluster.detect({}, account) is None and InCluster.detect(env, tmp_path / "none") is None
