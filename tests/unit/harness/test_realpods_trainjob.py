"""The realpods controller's TrainJob pods (k8s/kubelet/trainjob.py), from a TrainJob dist-jobs
renders: what the Job controller and the Trainer's torch plugin would put in them, and when the
TrainJob ends. The pods running for real are in tests/integration/test_k8s_pods.py."""

from __future__ import annotations

from typing import Any

import yaml

from dist_jobs.backends.k8s.backend import stamped
from dist_jobs.render import render
from dist_jobs.spec.load import load_spec
from support.realpods_tier import tier_module

trainjob = tier_module("trainjob")

SPEC = {
    "name": "tj",
    "nodes": 2,
    "procs_per_node": 2,
    "image": "localhost/img:1",
    "k8s": {"api": "trainjob", "pvc": "ckpt", "shm_size": "1Gi"},
}


def _trainjob() -> dict[str, Any]:
    body = stamped(yaml.safe_load(render(load_spec(data=SPEC), "k8s")), "sub1")
    body["metadata"]["uid"] = "uid-1"
    return body


def test_a_pod_is_the_runtimes_node_container_with_the_trainjob_and_the_torch_plugin_applied() -> None:
    tj = _trainjob()
    pod = trainjob.pod_body(tj, 1, "node-b", "10.0.0.7")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"].startswith("tj-node-0-1-") and len(meta["name"]) == len("tj-node-0-1-") + 5
    assert meta["annotations"][trainjob.INDEX] == "1" and meta["annotations"]["dist-jobs/submission"] == "sub1"
    assert meta["labels"]["jobset.sigs.k8s.io/jobset-name"] == "tj"
    assert meta["ownerReferences"][0]["kind"] == "TrainJob" and meta["ownerReferences"][0]["uid"] == "uid-1"
    assert (spec["hostname"], spec["subdomain"], spec["nodeName"]) == ("tj-node-0-1", "tj", "node-b")
    assert spec["restartPolicy"] == "OnFailure"
    assert spec["hostAliases"] == [{"ip": "10.0.0.7", "hostnames": ["tj-node-0-0.tj"]}]
    assert {v["name"] for v in spec["volumes"]} == {"dshm", "shared"}
    (container,) = spec["containers"]
    assert container["name"] == "node" and container["image"] == "localhost/img:1"
    assert container["command"] == tj["spec"]["trainer"]["command"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/dev/shm"}
    env = {e["name"]: e for e in container["env"]}
    assert (env["PET_NNODES"]["value"], env["PET_NPROC_PER_NODE"]["value"]) == ("2", "2")
    assert env["PET_MASTER_ADDR"]["value"] == "tj-node-0-0.tj" and env["PET_MASTER_PORT"]["value"] == "29500"
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{trainjob.INDEX}']"
    assert "DIST_JOBS_RUN" in env  # the TrainJob's own env comes first


def _pod(phase: str, restarts: int = 0) -> dict[str, Any]:
    return {"metadata": {}, "status": {"phase": phase, "containerStatuses": [{"restartCount": restarts}]}}


def test_the_trainjob_completes_when_every_pod_succeeded_and_fails_past_the_backoff_limit() -> None:
    tj = _trainjob()
    assert trainjob.judged(tj, {0: _pod("Succeeded")})[0] is None  # pod 1 not made yet
    assert trainjob.judged(tj, {0: _pod("Succeeded"), 1: _pod("Running", restarts=6)})[0] is None
    assert trainjob.judged(tj, {0: _pod("Succeeded"), 1: _pod("Succeeded")})[0] == "Complete"
    ended, message = trainjob.judged(tj, {0: _pod("Running", restarts=7), 1: _pod("Running")})
    assert ended == "Failed" and "node 0" in message
    assert trainjob.jobs_status(tj, {0: _pod("Running")}, None)[0]["active"] == 1
