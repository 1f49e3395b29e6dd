"""PyTorchJob / TrainJob manifests: valid against the real CRDs and the operator's admission rules."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_jobs.errors import SpecError
from dist_jobs.render import render
from dist_jobs.spec.load import load_spec
from support.k8s_offline.validate import admission_errors, crd_path, validate
from support.props import examples
from support.specs import K8S_SEED as SEED


def manifest(data: dict) -> dict:
    doc = yaml.safe_load(render(load_spec(data=data), "k8s"))
    errors = [str(e) for e in validate(doc, crd_path(doc["kind"]))]
    assert errors == [], errors
    if doc["kind"] == "PyTorchJob":
        assert admission_errors(doc) == []
    return doc


def container(doc: dict, rtype: str = "Master") -> dict:
    return doc["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"][0]


def test_seed_job_master_and_worker() -> None:
    doc = manifest(SEED)
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1
    assert doc["spec"]["nprocPerNode"] == "4"
    c = container(doc)
    assert c["name"] == "pytorch" and c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 4, "memory": "256Gi"}
    assert c["resources"]["requests"]["cpu"] == "32"
    assert c["command"][4:11] == [
        "python3",
        "-m",
        "dist_jobs.train.torchrun",
        "--nproc-per-node=4",
        "--no-python",
        "python3",
        "-m",
    ]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["DIST_JOBS_BACKEND"] == "k8s" and env["DIST_JOBS_CHECKPOINT_DIR"] == "/shared/checkpoints"
    assert env["DIST_JOBS_MAX_REQUEUES"] == "3"  # the pod entrypoint's restart cap
    assert env["DIST_JOBS_SUBMISSION"] == {"fieldRef": {"fieldPath": "metadata.annotations['dist-jobs/submission']"}}
    assert {"dshm", "shared"} == {
        v["name"] for v in doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    }
    assert replicas["Master"]["restartPolicy"] == "ExitCode"
    # under ExitCode the operator's backoffLimit caps nothing (kubeflow/trainer#2045): not rendered
    assert "backoffLimit" not in doc["spec"]["runPolicy"]


def env_of(doc: dict, rtype: str = "Master") -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(doc, rtype)["env"] if "value" in e}


def test_each_process_gets_the_threads_of_its_cpus_unless_the_user_says() -> None:
    """A pod sees every core of its node; without OMP_NUM_THREADS torch would start a thread per
    core in every process of every pod there."""
    assert env_of(manifest(SEED))["OMP_NUM_THREADS"] == "8"  # cpus_per_task, each of the 4 processes
    assert env_of(manifest(SEED), "Worker")["OMP_NUM_THREADS"] == "8"
    assert env_of(manifest({**SEED, "cpus_per_task": 1}))["OMP_NUM_THREADS"] == "1"
    assert env_of(manifest({**SEED, "env": {"OMP_NUM_THREADS": "3"}}))["OMP_NUM_THREADS"] == "3"


def test_single_node_has_no_worker() -> None:
    doc = manifest({**SEED, "nodes": 1})
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_elastic_policy_when_min_below_max() -> None:
    doc = manifest({**SEED, "nodes": 2, "k8s": {"min_nodes": 2, "max_nodes": 4, "max_restarts": 3}})
    assert doc["spec"]["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "maxRestarts": 3}
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Worker"]


def test_python_per_pod_with_several_procs_refused() -> None:
    with pytest.raises(SpecError) as err:
        render(load_spec(data={**SEED, "k8s": {"launch": "direct"}}), "k8s")
    assert "torchrun" in str(err.value) and "k8s.launch" in str(err.value)
    doc = manifest({**SEED, "gpus_per_node": 1, "k8s": {"launch": "direct"}})
    assert container(doc)["command"][4:] == [
        "python3",
        "-m",
        "dist_jobs.launch",
        "--",
        "python3",
        "-m",
        "dist_jobs.train",
    ]


def test_name_converted_to_dns1035() -> None:
    doc = manifest({**SEED, "name": "My_ResNet 50"})
    assert re.fullmatch(r"my-resnet-50-[0-9a-f]{10}", doc["metadata"]["name"])  # lossy: a hash keeps it unique
    long = manifest({**SEED, "name": "x" * 80, "nodes": 12})
    assert len(long["metadata"]["name"]) + len("-worker-10") <= 63


def test_shm_off_and_options() -> None:
    doc = manifest(
        {
            **SEED,
            "k8s": {
                "shm_size": None,
                "namespace": "ml",
                "service_account": "sa",
                "image_pull_secrets": ["r"],
                "priority_class": "hi",
                "queue": "q",
                "node_selector": {"gpu": "a100"},
                "ttl_seconds_after_finished": 60,
                "active_deadline_seconds": 3600,
                "restart_policy": "OnFailure",
                "backoff_limit": 7,
                "tolerations": [{"key": "g", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
    )
    pod = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert "volumes" not in pod and pod["serviceAccountName"] == "sa" and pod["nodeSelector"] == {"gpu": "a100"}
    rp = doc["spec"]["runPolicy"]
    assert rp["backoffLimit"] == 7 and rp["schedulingPolicy"] == {"queue": "q", "priorityClass": "hi"}
    assert doc["metadata"]["namespace"] == "ml"


def test_trainjob_valid_against_its_crd() -> None:
    doc = manifest({**SEED, "k8s": {"api": "trainjob"}})
    assert doc["kind"] == "TrainJob" and doc["spec"]["trainer"]["numNodes"] == 2
    assert doc["spec"]["trainer"]["numProcPerNode"] == 4


def test_trainjob_carries_the_pod_settings_through_runtime_patches() -> None:
    """Every pod-level setting a PyTorchJob has reaches the TrainJob's `node` pods (CRD v2.3)."""
    k8s = {
        "api": "trainjob",
        "pvc": "ckpt",
        "shm_size": "2Gi",
        "service_account": "trainer",
        "image_pull_secrets": ["regcred"],
        "node_selector": {"gpu": "a100"},
        "tolerations": [{"key": "g", "operator": "Exists", "effect": "NoSchedule"}],
        "labels": {"team": "ml"},
        "annotations": {"example.com/owner": "me"},
    }
    doc = manifest({**SEED, "preemption": {"grace_seconds": 600}, "k8s": k8s})
    pytorch = manifest({**SEED, "preemption": {"grace_seconds": 600}, "k8s": {**k8s, "api": "pytorchjob"}})
    (patch,) = doc["spec"]["runtimePatches"]
    assert patch["manager"] == "dist-jobs"
    (step,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert step["name"] == "node"
    pod = step["template"]["spec"]["template"]
    want = pytorch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert pod["metadata"]["labels"] == {**want["metadata"]["labels"], "dist-jobs/run": "resnet50-ddp"}
    assert pod["metadata"]["annotations"] == want["metadata"]["annotations"]
    settings = {k: v for k, v in want["spec"].items() if k != "containers"}
    assert {k: v for k, v in pod["spec"].items() if k != "containers"} == settings
    assert settings["terminationGracePeriodSeconds"] == 600 and settings["serviceAccountName"] == "trainer"
    mounts = want["spec"]["containers"][0]["volumeMounts"]
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": mounts}]


def test_validator_catches_a_broken_manifest() -> None:
    doc = manifest(SEED)
    container(doc)["volumeMount"] = []  # typo: pruned silently by a default apiserver
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    errors = " ".join(str(e) for e in validate(doc, crd_path("PyTorchJob")))
    assert "volumeMount" in errors and "replicas" in errors


@settings(max_examples=examples(30), deadline=None)
@given(
    nodes=st.integers(1, 6),
    gpus=st.integers(0, 8),
    procs=st.integers(1, 8),
    launch=st.sampled_from(["torchrun", "direct"]),
    shm=st.sampled_from([None, "1Gi"]),
    pvc=st.sampled_from([None, "ckpt"]),
    mem=st.sampled_from([None, "8G", "512M"]),
)
def test_any_valid_spec_gives_a_crd_valid_manifest(nodes, gpus, procs, launch, shm, pvc, mem) -> None:
    data = {
        "name": "fuzz",
        "nodes": nodes,
        "gpus_per_node": gpus,
        "procs_per_node": procs if not gpus else None,
        "image": "i:1",
        "memory": mem,
        "k8s": {"launch": launch, "shm_size": shm, "pvc": pvc},
    }
    if launch == "direct" and (procs if not gpus else gpus) > 1:
        with pytest.raises(SpecError):
            render(load_spec(data=data), "k8s")
        return
    manifest(data)
