"""The loopback stand-in apiserver, driven by the official `kubernetes` client (CustomObjectsApi),
answers like the real apiserver does (KUBERNETES_NOTES.md section 4)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from support.k8s_offline.validate import crd_path
from support.kube_standin import FakeKubeAPI, sample_pytorchjob
from support.tiers import require_module

kubernetes = require_module("kubernetes")
from kubernetes.client.rest import ApiException  # noqa: E402

GROUP, VERSION, PLURAL, NS = "kubeflow.org", "v1", "pytorchjobs", "default"
W = "spec.pytorchReplicaSpecs.Worker"


@pytest.fixture()
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI([crd_path("PyTorchJob")]) as server:
        yield server


@pytest.fixture()
def client(api: FakeKubeAPI) -> Any:
    cfg = kubernetes.client.Configuration()
    cfg.host = api.url
    with kubernetes.client.ApiClient(cfg) as api_client:
        yield kubernetes.client.CustomObjectsApi(api_client)


def _create(client: Any, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return client.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body, **kwargs)


def _error(call: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
    with pytest.raises(ApiException) as info:
        call(*args, **kwargs)
    exc = info.value
    try:
        return exc.status, json.loads(exc.body)
    except ValueError:
        return exc.status, exc.body


def _worker_container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def test_create_201_applies_defaults_and_server_fields(client: Any, api: FakeKubeAPI) -> None:
    job = sample_pytorchjob()
    job["spec"]["runPolicy"] = {}
    job["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    _worker_container(job)["ports"] = [{"name": "pytorchjob-port", "containerPort": 23456}]
    created = _create(client, job, field_validation="Strict")
    meta = created["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert created["spec"]["runPolicy"]["suspend"] is False
    assert _worker_container(created)["ports"][0]["protocol"] == "TCP"
    assert "status" not in created  # the status subresource owns it
    assert api.store[(PLURAL, NS, "llm-train-demo")]["metadata"]["uid"] == meta["uid"]
    assert api.requests[-1].query == {"fieldValidation": ["Strict"]}
    # client 37 sends its JSON body with no Content-Type; the apiserver then assumes JSON
    assert api.requests[-1].content_type in (None, "application/json")


def test_get_and_list_with_label_selector(client: Any, api: FakeKubeAPI) -> None:
    _create(client, sample_pytorchjob("a"))
    other = sample_pytorchjob("b")
    other["metadata"]["labels"] = {"app": "other"}
    _create(client, other)
    assert client.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "a")["metadata"]["name"] == "a"
    listed = client.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, label_selector="app=dist-jobs")
    assert listed["kind"] == "PyTorchJobList" and listed["apiVersion"] == "kubeflow.org/v1"
    assert listed["metadata"]["continue"] == ""
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    every = client.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert [i["metadata"]["name"] for i in every["items"]] == ["a", "b"]
    none = client.list_namespaced_custom_object(GROUP, VERSION, "elsewhere", PLURAL)
    assert none["items"] == []


def test_operator_written_status_is_served(client: Any, api: FakeKubeAPI) -> None:
    _create(client, sample_pytorchjob())
    api.set_status(PLURAL, NS, "llm-train-demo", {"conditions": [{"type": "Running", "status": "True"}]})
    got = client.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llm-train-demo")
    assert got["status"]["conditions"][0]["type"] == "Running"
    api.store[(PLURAL, NS, "llm-train-demo")]["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    got = client.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llm-train-demo")
    assert got["status"]["conditions"][0]["type"] == "Failed"


def test_create_again_is_409_already_exists(client: Any) -> None:
    _create(client, sample_pytorchjob())
    code, body = _error(_create, client, sample_pytorchjob())
    assert code == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pytorchjobs.kubeflow.org "llm-train-demo" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "llm-train-demo", "group": "kubeflow.org", "kind": "pytorchjobs"},
        "code": 409,
    }


def test_unknown_field_with_strict_is_400(client: Any, api: FakeKubeAPI) -> None:
    job = sample_pytorchjob()
    c = _worker_container(job)
    c["volumeMount"] = c.pop("volumeMounts")
    code, body = _error(_create, client, job, field_validation="Strict")
    assert code == 400 and body["reason"] == "BadRequest"
    assert body["message"] == (
        'PyTorchJob in version "v1" cannot be handled as a PyTorchJob: strict decoding error: '
        f'unknown field "{W}.template.spec.containers[0].volumeMount"'
    )
    assert api.store == {}


def test_unknown_field_by_default_is_dropped_with_only_a_warning_header(client: Any, api: FakeKubeAPI) -> None:
    job = sample_pytorchjob()
    c = _worker_container(job)
    c["volumeMount"] = c.pop("volumeMounts")
    created = _create(client, job)  # the client sends no fieldValidation: server default Warn
    assert "volumeMount" not in _worker_container(created) and "volumeMounts" not in _worker_container(created)
    assert api.requests[-1].query == {}
    assert api.requests[-1].warnings == [f'299 - "unknown field \\"{W}.template.spec.containers[0].volumeMount\\""']


def test_bad_types_are_422_with_causes(client: Any) -> None:
    job = sample_pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    _worker_container(job)["resources"]["limits"]["memory"] = "lots"
    code, body = _error(_create, client, job, field_validation="Strict")
    assert code == 422 and body["reason"] == "Invalid" and body["status"] == "Failure"
    assert body["message"].startswith('PyTorchJob.kubeflow.org "llm-train-demo" is invalid: [')
    details = body["details"]
    assert (details["name"], details["group"], details["kind"]) == ("llm-train-demo", "kubeflow.org", "PyTorchJob")
    causes = {c["field"]: c for c in details["causes"]}
    assert causes[f"{W}.replicas"] == {
        "reason": "FieldValueTypeInvalid",
        "field": f"{W}.replicas",
        "message": f'Invalid value: "string": {W}.replicas in body must be of type integer: "string"',
    }
    mem = f"{W}.template.spec.containers[0].resources.limits.memory"
    assert causes[mem]["reason"] == "FieldValueInvalid"
    assert causes[mem]["message"].startswith(f'Invalid value: "lots": {mem} in body should match')


def test_single_error_message_is_bare(client: Any) -> None:
    job = sample_pytorchjob()
    job["metadata"]["name"] = "Bad_Name"
    code, body = _error(_create, client, job)
    assert code == 422
    assert body["message"].startswith(
        'PyTorchJob.kubeflow.org "Bad_Name" is invalid: metadata.name: '
        'Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain'
    )


def test_webhook_denial_is_403(client: Any, api: FakeKubeAPI) -> None:
    job = sample_pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    code, body = _error(_create, client, job)
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == (
        'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied '
        "the request: spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1"
    )
    assert api.store == {}


def test_without_webhooks_the_same_job_is_created() -> None:
    job = sample_pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with FakeKubeAPI([crd_path("PyTorchJob")], webhooks=False) as server:
        cfg = kubernetes.client.Configuration()
        cfg.host = server.url
        with kubernetes.client.ApiClient(cfg) as api_client:
            _create(kubernetes.client.CustomObjectsApi(api_client), job)
        assert len(server.store) == 1


def test_dry_run_all_answers_201_and_stores_nothing(client: Any, api: FakeKubeAPI) -> None:
    created = _create(client, sample_pytorchjob(), dry_run="All", field_validation="Strict")
    assert created["metadata"]["name"] == "llm-train-demo" and created["metadata"]["uid"]
    assert api.store == {}
    code, _ = _error(client.get_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "llm-train-demo")
    assert code == 404


def test_delete_then_get_and_delete_again_are_404(client: Any, api: FakeKubeAPI) -> None:
    uid = _create(client, sample_pytorchjob())["metadata"]["uid"]
    deleted = client.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llm-train-demo")
    assert deleted == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "llm-train-demo", "group": "kubeflow.org", "kind": "pytorchjobs", "uid": uid},
    }
    missing = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pytorchjobs.kubeflow.org "llm-train-demo" not found',
        "reason": "NotFound",
        "details": {"name": "llm-train-demo", "group": "kubeflow.org", "kind": "pytorchjobs"},
        "code": 404,
    }
    assert _error(client.get_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "llm-train-demo") == (404, missing)
    assert _error(client.delete_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "llm-train-demo") == (
        404,
        missing,
    )


def test_crd_not_installed_is_plain_text_404(client: Any) -> None:
    with pytest.raises(ApiException) as info:
        client.create_namespaced_custom_object("kubeflow.org", "v1", NS, "tfjobs", {"kind": "TFJob"})
    assert info.value.status == 404
    assert info.value.body == "404 page not found\n"  # not JSON: callers must not json.loads it blindly
    assert info.value.headers["Content-Type"].startswith("text/plain")
    code, _ = _error(client.list_namespaced_custom_object, "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs")
    assert code == 404


def test_wrong_kind_api_version_and_namespace(client: Any) -> None:
    job = sample_pytorchjob()
    job["kind"] = "TFJob"
    code, body = _error(_create, client, job)
    assert (code, body["message"]) == (
        422,
        'TFJob.kubeflow.org "llm-train-demo" is invalid: kind: Invalid value: "TFJob": must be PyTorchJob',
    )
    job = sample_pytorchjob()
    job["apiVersion"] = "kubeflow.org/v2"
    code, body = _error(_create, client, job)
    assert (code, body["message"]) == (
        400,
        "the API version in the data (kubeflow.org/v2) does not match the expected API version (kubeflow.org/v1)",
    )
    job = sample_pytorchjob(namespace="other")
    code, body = _error(_create, client, job)
    assert (code, body["message"]) == (
        400,
        "the namespace of the provided object does not match the namespace sent on the request",
    )


def test_generate_name_gets_a_random_suffix(client: Any) -> None:
    job = sample_pytorchjob()
    del job["metadata"]["name"]
    job["metadata"]["generateName"] = "llm-train-"
    name = _create(client, job)["metadata"]["name"]
    assert name.startswith("llm-train-") and len(name) == len("llm-train-") + 5


def test_bad_create_options_are_422(client: Any) -> None:
    code, body = _error(_create, client, sample_pytorchjob(), field_validation="strict")  # case matters
    assert (code, body["message"]) == (
        422,
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: '
        'Unsupported value: "strict": supported values: "", "Ignore", "Strict", "Warn"',
    )
    assert body["details"]["causes"][0]["field"] == "fieldValidation"


def test_malformed_json_is_400(api: FakeKubeAPI) -> None:
    request = urllib.request.Request(
        f"{api.url}/apis/kubeflow.org/v1/namespaces/default/pytorchjobs", data=b"{not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    body = json.load(info.value)
    assert (info.value.code, body["reason"]) == (400, "BadRequest")
    assert body["message"].startswith(
        "the object provided is unrecognized (must be of type PyTorchJob): "
        "couldn't get version/kind; json parse error: "
    )


def test_discovery_version_and_unsupported_methods(api: FakeKubeAPI, client: Any) -> None:
    with urllib.request.urlopen(f"{api.url}/apis/kubeflow.org/v1", timeout=10) as resp:
        resources = json.load(resp)["resources"]
    assert {"name": "pytorchjobs", "kind": "PyTorchJob", "namespaced": True}.items() <= resources[0].items()
    version = kubernetes.client.VersionApi(client.api_client).get_code()
    assert (version.major, version.minor, version.git_version) == ("1", "20", "v1.20.2")
    _create(client, sample_pytorchjob())
    request = urllib.request.Request(
        f"{api.url}/apis/kubeflow.org/v1/namespaces/default/pytorchjobs/llm-train-demo", data=b"{}", method="PUT"
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 405 and json.load(info.value)["reason"] == "MethodNotAllowed"


def test_pods_by_label_and_logs(api: FakeKubeAPI, client: Any) -> None:
    labels = {"training.kubeflow.org/job-name": "llm-train-demo", "training.kubeflow.org/replica-type": "master"}
    api.pods[(NS, "llm-train-demo-master-0")] = {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
        "status": {"phase": "Running"},
    }
    api.pods[(NS, "unrelated")] = {"metadata": {"labels": {"app": "x"}}}
    api.pod_logs[(NS, "llm-train-demo-master-0")] = "step 1\nstep 2\nstep 3\n"
    core = kubernetes.client.CoreV1Api(client.api_client)
    pods = core.list_namespaced_pod(NS, label_selector="training.kubeflow.org/job-name=llm-train-demo")
    assert [p.metadata.name for p in pods.items] == ["llm-train-demo-master-0"]
    assert pods.items[0].status.phase == "Running"
    assert core.read_namespaced_pod_log("llm-train-demo-master-0", NS, tail_lines=2) == "step 2\nstep 3\n"
    assert core.read_namespaced_pod_log("llm-train-demo-master-0", NS, container="pytorch").startswith("step 1")
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod_log("llm-train-demo-worker-0", NS)
    assert info.value.status == 404 and json.loads(info.value.body)["message"] == (
        'pods "llm-train-demo-worker-0" not found'
    )
