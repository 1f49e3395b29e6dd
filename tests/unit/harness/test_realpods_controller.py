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


class RecordingApi:
    """No object exists until created; every create and delete is kept."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        return None

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
    ctl = controller.Controller(api, tmp_path, ["10.78.0.11", "10.78.0.12"], [])
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
