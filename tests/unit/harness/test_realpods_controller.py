"""The realpods controller's PyTorchJob decisions (k8s/kubelet/controller.py), against an API
that records what it is asked. The pods running for real are in tests/integration/test_k8s_pods.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dist_jobs.render import render
from dist_jobs.spec.load import load_spec
from support.realpods_tier import tier_module

controller = tier_module("controller")

SPEC = {"name": "pj", "nodes": 2, "procs_per_node": 2, "image": "localhost/img:1", "k8s": {"pvc": "ckpt"}}


NODES = ["10.78.0.11", "10.78.0.12"]


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


class RecordingApi:
    """No object exists until created, but the tier's nodes; every create and delete is kept."""

    def __init__(self, nodes: list[dict[str, Any]] | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.nodes = [_node(n) for n in NODES] if nodes is None else nodes
        self.listed: dict[str, list[dict[str, Any]]] = {}  # what items() answers, by path

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        return {"items": self.nodes} if path == "/api/v1/nodes" else None

    def items(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        return self.listed.get(path, [])

    def create(self, path: str, body: dict[str, Any]) -> None:
        self.created.append(body)

    def delete(self, path: str, grace: int | None = None) -> None:
        self.deleted.append(path.rsplit("/", 1)[-1])


def _pod(name: str, phase: str, ip: str, code: int | None = None) -> dict[str, Any]:
    state = {"terminated": {"exitCode": code}} if code is not None else {"running": {}}
    statuses = [{"name": "pytorch", "state": state, "restartCount": 0}]
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "status": {"phase": phase, "podIP": ip, "containerStatuses": statuses},
    }


def test_a_worker_gone_while_its_failed_master_is_listed_waits_for_the_new_master(tmp_path: Path) -> None:
    """Preemption: both pods exit 200 and the Worker's object is gone first. The Master is
    deleted to be recreated; a Worker made now would name the dead Master's address for good
    (hostAliases cannot change), so it waits until the new Master has one."""
    raw = yaml.safe_load(render(load_spec(data=SPEC), "k8s"))
    raw["metadata"].update(uid="uid-job", namespace=controller.NAMESPACE)
    job = controller.defaulted(raw)
    api = RecordingApi()
    ctl = controller.Controller(api, tmp_path, NODES, [])
    master = _pod("pj-master-0", "Failed", "10.78.16.5", code=200)
    status: dict[str, Any] = {}
    assert ctl.drive(job, controller.expected_pods(job), {"pj-master-0": master}, status) is False
    assert api.deleted == ["pj-master-0"]
    assert [b["metadata"]["name"] for b in api.created if b.get("kind") == "Pod"] == []
    assert [c["type"] for c in status["conditions"] if c["status"] == "True"] == ["Restarting"]
    # The new Master has its address: now the Worker is made, naming it.
    running = _pod("pj-master-0", "Running", "10.78.16.9")
    ctl.drive(job, controller.expected_pods(job), {"pj-master-0": running}, status)
    (worker,) = [b for b in api.created if b.get("kind") == "Pod"]
    assert worker["metadata"]["name"] == "pj-worker-0"
    assert worker["spec"]["hostAliases"] == [{"ip": "10.78.16.9", "hostnames": ["pj-master-0"]}]


def test_a_running_pods_hosts_file_follows_its_masters_endpoint(tmp_path: Path) -> None:
    """A Worker recreated while the old Master still ran names that Master's address. A cluster's
    DNS would give the new Master's on the next lookup (torch's store client looks again on each
    connect retry): its hosts file is rewritten in place, the address gone while no Master runs."""
    ctl = controller.Controller(RecordingApi(), tmp_path, ["10.78.0.11", "10.78.0.12"], [])
    ctl.kubelet_root = lambda node: tmp_path / f"node{node}"
    worker = _pod("pj-worker-0", "Running", "10.78.16.7")
    worker["spec"] = {"nodeName": "10.78.0.12", "hostAliases": [{"ip": "10.78.16.5", "hostnames": ["pj-master-0"]}]}
    hosts = tmp_path / "node2" / "pods" / "uid-pj-worker-0" / "etc-hosts"
    hosts.parent.mkdir(parents=True)
    kubelets = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.78.16.7\tpj-worker-0\n"
    hosts.write_text(kubelets + "\n# Entries added by HostAliases.\n10.78.16.5\tpj-master-0\n")
    inode = hosts.stat().st_ino

    ctl.follow_dns({"pj-worker-0": worker}, {"pj-master-0": "10.78.16.5", "pj-worker-0": "10.78.16.7"})
    assert hosts.read_text().endswith("10.78.16.5\tpj-master-0\n")  # still the Master's: untouched
    ctl.follow_dns({"pj-worker-0": worker}, {"pj-worker-0": "10.78.16.7"})  # the old Master ended
    assert hosts.read_text() == kubelets + "\n# Entries added by HostAliases.\n"
    ctl.follow_dns({"pj-worker-0": worker}, {"pj-master-0": "10.78.16.9", "pj-worker-0": "10.78.16.7"})
    assert hosts.read_text() == kubelets + "\n# Entries added by HostAliases.\n10.78.16.9\tpj-master-0\n"
    assert hosts.stat().st_ino == inode  # bind-mounted into the container: the same file


# -- the scheduler's node filter (nodeSelector, required node affinity) ---------------------------


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


def _req(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


NODE_OBJECTS = [_node("10.78.0.11", zone="a", gpus="2"), _node("10.78.0.12", zone="b", gpus="8")]


def test_without_constraints_a_pod_goes_to_its_default_node() -> None:
    assert controller.place({}, "10.78.0.12", NODE_OBJECTS) == ("10.78.0.12", "")


def test_a_name_excluded_by_match_fields_sends_the_pod_to_the_other_node() -> None:
    """What a pod patches into its job's template after its rank was killed on a node."""
    spec = _affinity({"matchFields": [_req("metadata.name", "NotIn", "10.78.0.12")]})
    assert controller.place(spec, "10.78.0.12", NODE_OBJECTS) == ("10.78.0.11", "")
    assert controller.place(spec, "10.78.0.11", NODE_OBJECTS) == ("10.78.0.11", "")
    spec = _affinity({"matchFields": [_req("metadata.name", "In", "10.78.0.12")]})
    assert controller.place(spec, "10.78.0.11", NODE_OBJECTS)[0] == "10.78.0.12"


def test_node_selector_labels_must_all_match() -> None:
    assert controller.place({"nodeSelector": {"zone": "b"}}, "10.78.0.11", NODE_OBJECTS)[0] == "10.78.0.12"
    assert controller.place({"nodeSelector": {"zone": "b", "gpus": "2"}}, "10.78.0.11", NODE_OBJECTS)[0] is None


def test_label_operators() -> None:
    node_a, node_b = NODE_OBJECTS
    cases = [
        (_req("zone", "In", "a", "c"), True, False),
        (_req("zone", "NotIn", "a"), False, True),
        (_req("missing", "NotIn", "x"), True, True),  # an absent label is not in any set
        (_req("zone", "Exists"), True, True),
        (_req("missing", "Exists"), False, False),
        (_req("missing", "DoesNotExist"), True, True),
        (_req("zone", "DoesNotExist"), False, False),
        (_req("gpus", "Gt", "4"), False, True),
        (_req("gpus", "Lt", "4"), True, False),
        (_req("zone", "Gt", "1"), False, False),  # not an integer: no match
        (_req("missing", "Lt", "9"), False, False),
    ]
    for req, on_a, on_b in cases:
        spec = _affinity({"matchExpressions": [req]})
        assert (controller.unfit(spec, node_a) is None, controller.unfit(spec, node_b) is None) == (on_a, on_b), req


def test_terms_are_ored_and_requirements_within_a_term_anded() -> None:
    both = {
        "matchExpressions": [_req("zone", "In", "a", "b")],
        "matchFields": [_req("metadata.name", "NotIn", "10.78.0.11")],
    }
    assert controller.place(_affinity(both), "10.78.0.11", NODE_OBJECTS)[0] == "10.78.0.12"
    impossible = {"matchExpressions": [_req("zone", "In", "a"), _req("gpus", "In", "8")]}
    assert controller.place(_affinity(impossible), "10.78.0.11", NODE_OBJECTS)[0] is None
    either = _affinity(impossible, {"matchExpressions": [_req("gpus", "In", "8")]})
    assert controller.place(either, "10.78.0.11", NODE_OBJECTS)[0] == "10.78.0.12"
    assert controller.place(_affinity({}), "10.78.0.11", NODE_OBJECTS)[0] is None  # an empty term matches nothing


def test_a_pod_that_fits_no_node_is_not_created_and_its_job_waits(tmp_path: Path) -> None:
    raw = yaml.safe_load(render(load_spec(data=SPEC), "k8s"))
    raw["metadata"].update(uid="uid-job", namespace=controller.NAMESPACE)
    master = raw["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    master["nodeSelector"] = {"zone": "nowhere"}
    job = controller.defaulted(raw)
    api = RecordingApi()
    ctl = controller.Controller(api, tmp_path, NODES, [])
    assert ctl.drive(job, controller.expected_pods(job), {}, {}) is False
    assert [b for b in api.created if b.get("kind") == "Pod"] == []
    assert "0/2 nodes are available" in ctl.unschedulable["pj-master-0"]


def test_a_recreated_pod_comes_from_the_jobs_current_template(tmp_path: Path) -> None:
    """The Worker ran on node 2; its job's template now excludes node 2: it is made on node 1."""
    raw = yaml.safe_load(render(load_spec(data=SPEC), "k8s"))
    raw["metadata"].update(uid="uid-job", namespace=controller.NAMESPACE)
    worker = raw["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker.update(_affinity({"matchFields": [_req("metadata.name", "NotIn", "10.78.0.12")]}))
    job = controller.defaulted(raw)
    api = RecordingApi()
    ctl = controller.Controller(api, tmp_path, NODES, [])
    running = _pod("pj-master-0", "Running", "10.78.16.9")
    ctl.drive(job, controller.expected_pods(job), {"pj-master-0": running}, {})
    (pod,) = [b for b in api.created if b.get("kind") == "Pod"]
    assert (pod["metadata"]["name"], pod["spec"]["nodeName"]) == ("pj-worker-0", "10.78.0.11")
    assert "automountServiceAccountToken" not in pod["spec"]  # the pod's ServiceAccount decides


# -- the garbage collector and the root CA publisher ----------------------------------------------


def _owned(name: str, *owners: tuple[str, str]) -> dict[str, Any]:
    refs = [{"apiVersion": "kubeflow.org/v1", "kind": kind, "name": "j", "uid": uid} for kind, uid in owners]
    return {"metadata": {"name": name, "ownerReferences": refs}}


def test_objects_whose_job_owners_are_all_gone_are_garbage() -> None:
    objects = [
        _owned("gone", ("PyTorchJob", "uid-gone")),
        _owned("live", ("PyTorchJob", "uid-live")),
        _owned("half", ("PyTorchJob", "uid-gone"), ("TrainJob", "uid-live")),
        _owned("other-owner", ("PyTorchJob", "uid-gone"), ("Deployment", "uid-d")),  # not ours to judge
        {"metadata": {"name": "kube-root-ca.crt"}},  # no owner: never garbage
    ]
    assert [o["metadata"]["name"] for o in controller.owned_garbage(objects, {"uid-live"})] == ["gone"]


def test_the_collector_deletes_a_deleted_jobs_account_role_and_binding(tmp_path: Path) -> None:
    api = RecordingApi()
    ctl = controller.Controller(api, tmp_path, NODES, [])
    job = {"metadata": {"name": "pj", "uid": "uid-pj"}}
    for kind in ("serviceaccounts", "roles", "rolebindings", "configmaps"):
        api.listed[controller.ns_path(kind)] = [_owned(f"pj-{kind}", ("PyTorchJob", "uid-pj"))]
    ctl.collect([job], [])
    assert api.deleted == []
    ctl.collect([], [])  # the job is gone
    assert sorted(api.deleted) == ["pj-configmaps", "pj-rolebindings", "pj-roles", "pj-serviceaccounts"]
    assert (
        controller.ns_path("roles", "x")
        == f"/apis/rbac.authorization.k8s.io/v1/namespaces/{controller.NAMESPACE}/roles/x"
    )


def test_the_root_ca_configmap_is_published(tmp_path: Path) -> None:
    api = RecordingApi()
    controller.Controller(api, tmp_path, NODES, [], root_ca="PEM").publish_root_ca()
    assert api.created == [{"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "PEM"}}]
