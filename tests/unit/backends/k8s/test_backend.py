"""The Kubernetes backend, driven through the real `kubernetes` client's REST layer against the
loopback stand-in apiserver (tests/kube_standin.py): what it sends, what ends up stored, how every
apiserver answer (and silence) becomes a message with a hint, and how long a silence may last."""

from __future__ import annotations

import copy
import json
import queue
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.backends.base import Prepared
from dist_jobs.backends.k8s import client as k8s_client
from dist_jobs.backends.k8s.backend import MANAGED, K8sBackend, stamped
from dist_jobs.backends.k8s.kinds import KINDS
from dist_jobs.errors import BackendError, UsageError
from dist_jobs.rundir.node_affinity import avoiding
from dist_jobs.rundir.quarantine import keep_away
from dist_jobs.rundir.verdict import Action, Ending, Verdict
from dist_jobs.spec.load import load_spec
from support.k8s_offline.validate import crd_path, prune_and_default
from support.kube_standin import FakeKubeAPI, sample_pytorchjob, untrusted_https
from support.specs import K8S_SEED as SEED
from support.tiers import require_module

kubernetes = require_module("kubernetes")

ELASTIC = {**SEED, "name": "elastic-ddp", "k8s": {"pvc": "ckpt", "min_nodes": 2, "max_nodes": 4}}
TRAINJOB = {**SEED, "name": "resnet-trainjob", "k8s": {"api": "trainjob", "namespace": "ml", "pvc": "ckpt"}}
JOB, NS, PLURAL = "resnet50-ddp", "default", "pytorchjobs"
SERVER_META = {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"}
OP = "training.kubeflow.org/"


@pytest.fixture()
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI([crd_path("PyTorchJob"), crd_path("TrainJob")]) as server:
        yield server


def _backend(url: str, **kwargs: Any) -> K8sBackend:
    return K8sBackend(api_client=k8s_client.for_host(url), **kwargs)


@pytest.fixture()
def backend(api: FakeKubeAPI) -> K8sBackend:
    return _backend(api.url)


def _prepared(backend: K8sBackend, data: dict[str, Any] = SEED) -> Prepared:
    return backend.prepare(load_spec(data=data))


def _edited(prepared: Prepared, edit: Any) -> Prepared:
    """The same Prepared with its manifest changed by `edit(doc)`: a payload render() would never make."""
    doc = next(yaml.safe_load_all(prepared.payload))
    edit(doc)
    return Prepared(prepared.backend, prepared.spec, yaml.safe_dump(doc), prepared.filename)


def _error(call: Any, *args: Any, **kwargs: Any) -> BackendError:
    with pytest.raises(BackendError) as info:
        result = call(*args, **kwargs)
        if isinstance(result, Iterator):
            list(result)
    return info.value


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _posts(api: FakeKubeAPI) -> list[Any]:
    """The job creates (what the job owns is created after it: test_submit_creates_what_the_job_owns...)."""
    return [r for r in api.requests if r.method == "POST" and "kubeflow.org/" in r.path]


# --- submit -----------------------------------------------------------------------------------


def test_submit_creates_with_strict_field_validation_and_stores_the_rendered_manifest(
    api: FakeKubeAPI, backend: K8sBackend
) -> None:
    prepared = _prepared(backend)
    assert backend.schedule(prepared).job_id == JOB
    (post,) = _posts(api)
    assert post.path == f"/apis/kubeflow.org/v1/namespaces/{NS}/{PLURAL}"
    assert post.query == {"fieldValidation": ["Strict"]}
    manifest = next(yaml.safe_load_all(prepared.payload))
    stamp = post.body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"]
    submission = stamp["dist-jobs/submission"]
    assert len(submission) == 12, "each submission stamps its pods (the restart counter's key)"
    assert post.body == stamped(manifest, submission), "the rendered manifest, stamped, is the request body"
    expected, pruned = prune_and_default(post.body)
    assert pruned == []
    stored = copy.deepcopy(api.store[(PLURAL, NS, JOB)])
    assert SERVER_META <= set(stored["metadata"])
    for key in SERVER_META:
        del stored["metadata"][key]
    assert stored == expected
    assert stored != manifest and stored["spec"]["runPolicy"]["suspend"] is False  # the CRD's defaults


def test_server_dry_run_is_checked_but_stores_nothing(api: FakeKubeAPI, backend: K8sBackend) -> None:
    prepared = _prepared(backend)
    assert "dryRun=All" in backend.check(prepared)
    assert api.store == {}
    assert _posts(api)[-1].query == {"fieldValidation": ["Strict"], "dryRun": ["All"]}
    assert backend.schedule(prepared).job_id == JOB  # the dry run did not take the name


def test_server_dry_run_reports_what_a_real_create_would(backend: K8sBackend) -> None:
    bad = _edited(_prepared(backend), lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2))
    assert "403" in _error(backend.check, bad).message


def test_second_submit_is_409_with_a_hint(backend: K8sBackend) -> None:
    prepared = _prepared(backend)
    backend.schedule(prepared)
    err = _error(backend.schedule, prepared)
    assert "409 AlreadyExists" in err.message and f'"{JOB}" already exists' in err.message
    assert err.hint and f"dist-jobs cancel k8s://{NS}/PyTorchJob/{JOB}" in err.hint


def test_a_trainjobs_hints_carry_its_kind(api: FakeKubeAPI) -> None:
    """A bare name in a hint is looked up as a PyTorchJob: the user got a 404 following it."""
    backend = _backend(api.url, kind="TrainJob", namespace="ml")
    prepared = _prepared(backend, TRAINJOB)
    backend.schedule(prepared)
    err = _error(backend.schedule, prepared)
    assert err.hint and "dist-jobs cancel k8s://ml/TrainJob/resnet-trainjob" in err.hint
    no_pod = _error(backend.logs, "resnet-trainjob", rank=5)
    assert no_pod.hint and "dist-jobs status k8s://ml/TrainJob/resnet-trainjob" in no_pod.hint
    assert "--backend k8s resnet-trainjob" not in f"{err.hint} {no_pod.hint}"


def test_resubmitting_while_the_old_job_is_terminating_says_to_wait(api: FakeKubeAPI, backend: K8sBackend) -> None:
    """Deleting a job that is being deleted does nothing: the hint said to."""
    prepared = _prepared(backend)
    backend.schedule(prepared)
    api.store[(PLURAL, NS, JOB)]["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    err = _error(backend.schedule, prepared)
    assert "object is being deleted" in err.message and "still being deleted" in err.message
    assert err.hint and f"kubectl wait --for=delete pytorchjobs.kubeflow.org/{JOB} -n {NS}" in err.hint
    assert "cancel" not in err.hint and "delete the old job" not in err.hint


def test_schema_violations_are_422_with_every_field_cause(api: FakeKubeAPI, backend: K8sBackend) -> None:
    def break_it(doc: dict[str, Any]) -> None:
        worker = doc["spec"]["pytorchReplicaSpecs"]["Worker"]
        worker["replicas"] = "two"
        worker["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "lots"

    err = _error(backend.schedule, _edited(_prepared(backend), break_it))
    lines = err.message.splitlines()
    assert "422 Invalid" in lines[0]
    w = "spec.pytorchReplicaSpecs.Worker"
    assert any(
        line.startswith(f"  - {w}.replicas: Invalid value: ") and "must be of type integer" in line for line in lines
    ), lines
    assert any(
        line.startswith(f'  - {w}.template.spec.containers[0].resources.limits.memory: Invalid value: "lots"')
        for line in lines
    ), lines
    assert err.hint and "job.yaml" in err.hint
    assert api.store == {}


def test_unknown_field_is_refused_because_submit_asks_for_strict(api: FakeKubeAPI, backend: K8sBackend) -> None:
    def typo(doc: dict[str, Any]) -> None:
        container = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        container["volumeMount"] = container.pop("volumeMounts")

    err = _error(backend.schedule, _edited(_prepared(backend), typo))
    assert "400 BadRequest" in err.message and "strict decoding error" in err.message
    assert 'unknown field "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].volumeMount"' in err.message
    assert err.hint and "misspelled" in err.hint
    assert api.store == {}, "the stand-in's default (Warn) would have stored it with the field dropped"


def test_webhook_denial_is_403_with_the_webhooks_message(backend: K8sBackend) -> None:
    bad = _edited(_prepared(backend), lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2))
    err = _error(backend.schedule, bad)
    assert (
        'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the request: '
        "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1"
    ) in err.message
    assert "(403 Forbidden)" in err.message
    assert err.hint and "webhook" in err.hint


@pytest.mark.parametrize(
    ("data", "kind", "hint"), [(SEED, "PyTorchJob", "training operator"), (TRAINJOB, "TrainJob", "Trainer v2")]
)
def test_crd_not_installed_is_the_plain_text_404(data: dict[str, Any], kind: str, hint: str) -> None:
    with FakeKubeAPI([]) as bare:
        backend = _backend(bare.url, kind=kind)
        err = _error(backend.schedule, _prepared(backend, data))
        assert "404 page not found" in err.message and f"the {kind} CRD is not installed" in err.message
        assert err.hint and hint in err.hint
        status_err = _error(backend.status, "anything")
        assert f"the {kind} CRD is not installed" in status_err.message


def test_unreachable_server_is_a_clear_message_not_a_traceback() -> None:
    url = _closed_port_url()
    backend = _backend(url)
    start = time.monotonic()
    err = _error(backend.schedule, _prepared(backend))
    assert time.monotonic() - start < 10
    assert err.message.startswith(f"cannot reach the Kubernetes apiserver at {url}: ")
    assert "Connection refused" in err.message
    assert err.hint and "kubectl cluster-info" in err.hint
    assert "cannot reach" in _error(backend.list).message


@pytest.fixture()
def silent_url() -> Iterator[str]:
    """An address that accepts TCP connections (the kernel's backlog) and never says anything."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        yield f"127.0.0.1:{silent.getsockname()[1]}"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_hung_apiserver_gives_a_clear_error_within_15_seconds(silent_url: str) -> None:
    """A GET is retried by urllib3 by default (4 tries, the client sets no read timeout): here one
    read timeout ends it, and an HTTPS server that never finishes the TLS handshake is the same."""
    for scheme in ("http", "https"):
        backend = _backend(f"{scheme}://{silent_url}")
        start = time.monotonic()
        err = _error(backend.status, JOB)
        took = time.monotonic() - start
        assert took < 15, (scheme, took)
        assert "did not answer in time" in err.message, err.message
        assert err.hint and "kubectl cluster-info" in err.hint and "may have been created" not in err.hint
    assert took < k8s_client.READ_S + 2  # the TLS handshake is bounded by the connect timeout


def test_a_timed_out_create_says_the_job_may_exist(silent_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_client, "WRITE_S", 0.5)
    backend = _backend(f"http://{silent_url}")
    err = _error(backend.schedule, _prepared(backend))
    assert err.message.startswith(f"create PyTorchJob {NS}/{JOB}: the Kubernetes apiserver at http://{silent_url}")
    assert (
        err.hint and "may have been created" in err.hint and f"dist-jobs status k8s://{NS}/PyTorchJob/{JOB}" in err.hint
    )


def test_a_create_waits_out_a_slow_apiserver_that_a_read_would_not(
    api: FakeKubeAPI, backend: K8sBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write waits as long as the apiserver lets a request run (admission webhooks included): a
    create cut short by the read's limit would leave the user not knowing whether the job exists."""
    monkeypatch.setattr(k8s_client, "READ_S", 0.2)
    api.latency = 1.0
    handle = backend.schedule(_prepared(backend))
    assert handle.job_id == JOB and (PLURAL, NS, JOB) in api.store
    err = _error(backend.status, JOB)
    assert "did not answer in time (5 s to connect, 0 s to answer)" in err.message, err.message


def test_an_untrusted_certificate_is_named_as_such(tmp_path: Any) -> None:
    """Not "is the cluster up?": the server answered, with a certificate the kubeconfig's CA did not sign."""
    with untrusted_https(tmp_path) as url:
        err = _error(_backend(url).status, JOB)
    assert "TLS certificate is not trusted" in err.message and "CERTIFICATE_VERIFY_FAILED" in err.message
    assert err.hint and "certificate-authority" in err.hint and "cluster up" not in err.hint


def test_a_missing_namespace_says_to_create_it() -> None:
    from dist_jobs.backends.k8s.errors import api_error

    class Missing(Exception):
        status = 404
        body = json.dumps(
            {
                "kind": "Status",
                "status": "Failure",
                "message": 'namespaces "ml" not found',
                "reason": "NotFound",
                "details": {"name": "ml", "kind": "namespaces"},
                "code": 404,
            }
        )

    err = api_error(Missing(), "create PyTorchJob ml/j")
    assert err.message == 'create PyTorchJob ml/j: namespaces "ml" not found (404 NotFound)'
    assert err.hint and "kubectl create namespace ml" in err.hint and "k8s.namespace" in err.hint


# --- status, list, cancel ---------------------------------------------------------------------


def _conditions(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [
        {
            "type": t,
            "status": s,
            "reason": f"PyTorchJob{t}",
            "message": f"PyTorchJob {JOB} is {t.lower()}.",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
        for t, s in pairs
    ]


def test_status_follows_the_operators_conditions_and_replica_counts(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    first = backend.status(JOB)
    assert (first.job_id, first.state, first.extra, first.finished) == (JOB, "Pending", {}, False)

    api.set_status(PLURAL, NS, JOB, {"conditions": _conditions(("Created", "True"))})
    assert backend.status(JOB).state == "Created"

    selector = f"{OP}job-name={JOB},{OP}replica-type=worker"
    api.set_status(
        PLURAL,
        NS,
        JOB,
        {
            "conditions": _conditions(("Created", "True"), ("Running", "True")),
            "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1, "selector": selector}},
        },
    )
    running = backend.status(JOB)
    assert (running.state, running.finished) == ("Running", False)
    assert running.detail == f"PyTorchJob {JOB} is running."
    assert running.extra == {"Master": "active=1", "Worker": "active=1"}  # counts only, no selector

    api.set_status(
        PLURAL,
        NS,
        JOB,
        {
            "conditions": _conditions(("Created", "True"), ("Running", "False"), ("Succeeded", "True")),
            "replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"succeeded": 1}},
        },
    )
    done = backend.status(JOB)
    assert (done.state, done.finished, done.extra["Worker"]) == ("Succeeded", True, "succeeded=1")


def test_status_of_a_job_being_deleted_is_terminating(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    api.store[(PLURAL, NS, JOB)]["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert backend.status(JOB).state == "Terminating"


def test_list_selects_the_jobs_dist_jobs_manages(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    backend.schedule(_prepared(backend, {**SEED, "name": "second"}))
    api_client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "kubeflow.org", "v1", NS, PLURAL, sample_pytorchjob("made-by-hand")
    )
    assert sorted(s.name for s in backend.list()) == ["resnet50-ddp", "second"]
    listing = [r for r in api.requests if r.method == "GET" and r.path.endswith(f"/namespaces/{NS}/{PLURAL}")]
    assert listing[-1].query["labelSelector"] == [MANAGED]
    assert _backend(api.url, namespace="elsewhere").list() == []


def test_cancel_deletes_then_status_is_404(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    backend.cancel(JOB)
    delete = api.requests[-1]
    assert (delete.method, delete.path) == ("DELETE", f"/apis/kubeflow.org/v1/namespaces/{NS}/{PLURAL}/{JOB}")
    assert delete.query["propagationPolicy"] == ["Foreground"]
    assert api.store == {}
    err = _error(backend.status, JOB)
    assert f'pytorchjobs.kubeflow.org "{JOB}" not found (404 NotFound)' in err.message
    assert err.hint and "dist-jobs list --backend k8s" in err.hint
    assert "not found" in _error(backend.cancel, JOB).message


# --- logs -------------------------------------------------------------------------------------


def _operator_pod(api: FakeKubeAPI, job: str, rtype: str, index: int, text: str, ns: str = NS) -> str:
    """A pod labelled the way training-operator v1.9 labels the pods it creates."""
    name = f"{job}-{rtype}-{index}"
    labels = {
        f"{OP}job-name": job,
        f"{OP}operator-name": "pytorchjob-controller",
        f"{OP}replica-type": rtype,
        f"{OP}replica-index": str(index),
    }
    if rtype == "master" or (rtype == "worker" and index == 0 and job.startswith("elastic")):
        labels[f"{OP}job-role"] = "master"
    api.pods[(ns, name)] = {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "pytorch", "image": "reg.example/train:1"}]},
    }
    api.pod_logs[(ns, name)] = text
    return name


DIRECT = {**SEED, "name": "direct-ddp", "gpus_per_node": 1, "k8s": {"pvc": "ckpt", "launch": "direct"}}


def test_logs_tell_every_rank_and_find_one_by_its_global_rank(api: FakeKubeAPI, backend: K8sBackend) -> None:
    """torchrun pods hold 4 ranks each: every rank's lines come `[rank N] ...` (torchrun wrote the
    prefix), torchrun's and the entrypoint's own `[node P] ...`; --rank finds a rank in any pod."""
    backend.schedule(_prepared(backend))
    _operator_pod(api, JOB, "master", 0, "[rank 0] a\n[rank 1] b\nagent line\n")
    worker = _operator_pod(api, JOB, "worker", 0, "[rank 4] w\n[rank 5] x\n")
    _operator_pod(api, "other-job", "worker", 0, "[rank 5] not this one\n")  # same replica labels, other job
    assert list(backend.logs(JOB)) == ["[rank 0] a", "[rank 1] b", "[node 0] agent line", "[rank 4] w", "[rank 5] x"]
    assert list(backend.logs(JOB, rank=5)) == ["x"]
    read = api.requests[-1]
    assert read.path == f"/api/v1/namespaces/{NS}/pods/{worker}/log" and read.query["container"] == ["pytorch"]
    assert list(backend.logs(JOB, rank=1)) == ["b"]
    with pytest.raises(UsageError):
        list(backend.logs(JOB, rank=-1))


def test_logs_of_one_process_pods_are_the_pods_by_rank(api: FakeKubeAPI, backend: K8sBackend) -> None:
    job = backend.schedule(_prepared(backend, DIRECT)).job_id
    _operator_pod(api, job, "master", 0, "master line 1\nmaster line 2\n")
    _operator_pod(api, job, "worker", 0, "worker line\n")
    assert list(backend.logs(job)) == ["[rank 0] master line 1", "[rank 0] master line 2", "[rank 1] worker line"]
    assert list(backend.logs(job, rank=1)) == ["worker line"]
    err = _error(backend.logs, job, rank=2)
    assert "has no pod with rank 2" in err.message and f"{job}-master-0, {job}-worker-0" in err.message


def test_logs_before_the_pods_exist_and_of_a_missing_job(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    err = _error(backend.logs, JOB)
    assert "no pod with rank 0 (its pods: none yet)" in err.message and err.hint and "status" in err.hint
    assert "not found" in _error(backend.logs, "no-such-job").message
    _operator_pod(api, JOB, "master", 0, "")  # nothing written yet: the apiserver answers 204, no body
    assert list(backend.logs(JOB)) == []


def test_logs_of_a_pod_that_has_not_started_is_an_error_not_silence(api: FakeKubeAPI, backend: K8sBackend) -> None:
    """The apiserver answers an unscheduled pod's log with nothing (204): `logs` must not print nothing, exit 0."""
    backend.schedule(_prepared(backend))
    master = _operator_pod(api, JOB, "master", 0, "")
    api.pods[(NS, master)]["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    err = _error(backend.logs, JOB)
    assert err.message == f"PyTorchJob {NS}/{JOB}: pod {master} is Pending (Unschedulable): it has no log yet"
    assert err.hint and f"kubectl describe pod {master}" in err.hint
    waiting = {"name": "pytorch", "state": {"waiting": {"reason": "ContainerCreating"}}}
    api.pods[(NS, master)]["status"] = {"phase": "Pending", "containerStatuses": [waiting]}
    assert "is ContainerCreating" in _error(backend.logs, JOB).message
    restarted = {**waiting, "lastState": {"terminated": {"exitCode": 200}}}
    api.pods[(NS, master)]["status"] = {"phase": "Pending", "containerStatuses": [restarted]}
    api.pod_logs[(NS, master)] = "the last run's log\n"
    assert list(backend.logs(JOB)) == ["[node 0] the last run's log"]  # a restarting container still has one


def test_elastic_job_without_master_ranks_workers_from_zero(api: FakeKubeAPI, backend: K8sBackend) -> None:
    prepared = _prepared(backend, ELASTIC)
    assert "Master" not in next(yaml.safe_load_all(prepared.payload))["spec"]["pytorchReplicaSpecs"]
    job = backend.schedule(prepared).job_id
    # The rendezvous, not the pod name, orders an elastic job's ranks.
    _operator_pod(api, job, "worker", 0, "[rank 4] w0\n")
    _operator_pod(api, job, "worker", 1, "[rank 0] w1\n")
    assert list(backend.logs(job, rank=0)) == ["w1"]
    assert list(backend.logs(job, rank=4)) == ["w0"]


def test_selector_maps_rank_to_replica_type_and_index() -> None:
    kind = KINDS["PyTorchJob"]
    master = {"spec": {"pytorchReplicaSpecs": {"Master": {}, "Worker": {}}}}
    elastic = {"spec": {"pytorchReplicaSpecs": {"Worker": {}}}}
    assert kind.rank_selector("j", 0, master).endswith("replica-type=master,training.kubeflow.org/replica-index=0")
    assert kind.rank_selector("j", 3, master).endswith("replica-type=worker,training.kubeflow.org/replica-index=2")
    assert kind.rank_selector("j", 3, elastic).endswith("replica-type=worker,training.kubeflow.org/replica-index=3")


@pytest.mark.timeout(60)
def test_follow_streams_lines_as_the_container_writes_them(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    master = _operator_pod(api, JOB, "master", 0, "")
    chunks: queue.Queue[str | None] = queue.Queue()
    api.pod_logs[(NS, master)] = chunks
    api.follow_timeout = 5.0  # if the client buffered to the end, the stream ends here and the test fails
    lines = backend.logs(JOB, follow=True)
    chunks.put("[rank 0] step 1 loss 2.3\n")
    start = time.monotonic()
    assert next(lines) == "[rank 0] step 1 loss 2.3"
    assert time.monotonic() - start < 4, "the line only came when the stream ended: not followed"
    chunks.put("[rank 0] step 2 ")
    chunks.put("loss 2.1\n")
    assert next(lines) == "[rank 0] step 2 loss 2.1"
    # A pod that starts later is followed too; the output ends once the job has ended.
    worker = _operator_pod(api, JOB, "worker", 0, "")
    later: queue.Queue[str | None] = queue.Queue()
    api.pod_logs[(NS, worker)] = later
    later.put("[rank 4] worker up\n")
    assert next(lines) == "[rank 4] worker up"
    chunks.put(None)  # the containers exit, then the operator says the job succeeded
    later.put(None)
    api.set_status(PLURAL, NS, JOB, {"conditions": _conditions(("Created", "True"), ("Succeeded", "True"))})
    assert list(lines) == []
    read = [r for r in api.requests if r.path.endswith("/log")][-1]
    assert read.query["follow"] == ["true"] and read.query["container"] == ["pytorch"]


def test_follow_of_one_rank_reads_every_pod_for_it(api: FakeKubeAPI, backend: K8sBackend) -> None:
    backend.schedule(_prepared(backend))
    _operator_pod(api, JOB, "master", 0, "[rank 0] m\n[rank 1] m1\n")
    _operator_pod(api, JOB, "worker", 0, "[rank 5] w5\nagent\n")
    api.set_status(PLURAL, NS, JOB, {"conditions": _conditions(("Created", "True"), ("Succeeded", "True"))})
    assert list(backend.logs(JOB, rank=5, follow=True)) == ["w5"]


def test_follow_errors_are_translated_too() -> None:
    backend = _backend(_closed_port_url())
    assert "cannot reach" in _error(backend.logs, JOB, follow=True).message


# --- TrainJob -----------------------------------------------------------------------------------


def test_trainjob_submit_picks_the_kind_from_the_manifest(api: FakeKubeAPI, backend: K8sBackend) -> None:
    assert backend.kind.name == "PyTorchJob"
    job = backend.schedule(_prepared(backend, TRAINJOB)).job_id
    assert _posts(api)[-1].path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs"
    assert ("trainjobs", "ml", job) in api.store

    trainer = _backend(api.url, kind="TrainJob", namespace="ml")
    assert trainer.status(job).state == "Pending"
    api.set_status(
        "trainjobs",
        "ml",
        job,
        {
            "conditions": [
                {
                    "type": "Complete",
                    "status": "True",
                    "reason": "JobsCompleted",
                    "message": "TrainJob is completed",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ],
            "jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 2, "failed": 0, "suspended": 0}],
        },
    )
    done = trainer.status(job)
    assert (done.state, done.detail) == ("Complete", "TrainJob is completed")
    assert done.extra == {"node": "active=0 failed=0 ready=0 succeeded=2 suspended=0"}
    assert [s.name for s in trainer.list()] == [job]
    assert "not found" in _error(_backend(api.url, namespace="ml").status, job).message  # not a PyTorchJob
    trainer.cancel(job)
    assert api.store == {}


def test_trainjob_logs_pick_the_node_pod_by_completion_index(api: FakeKubeAPI) -> None:
    trainer = _backend(api.url, kind="TrainJob", namespace="ml")
    job = trainer.schedule(_prepared(trainer, TRAINJOB)).job_id
    for index, suffix in ((0, "x7k2p"), (1, "b9qzt")):
        name = f"{job}-node-0-{index}-{suffix}"
        api.pods[("ml", name)] = {
            "metadata": {
                "labels": {"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": "node"},
                "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            },
            "spec": {"containers": [{"name": "node", "image": "reg.example/train:1"}]},
        }
        api.pod_logs[("ml", name)] = f"[rank {4 * index + 1}] node rank {index}\n"
    assert list(trainer.logs(job, rank=5)) == ["node rank 1"]
    assert api.requests[-1].query["container"] == ["node"]
    assert list(trainer.logs(job)) == ["[rank 1] node rank 0", "[rank 5] node rank 1"]


def test_unknown_kind_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="TFJob"):
        K8sBackend(kind="TFJob")


# --- never the same bad node twice (render.k8s.access_objects, rundir.node_affinity) ----------


def test_submit_creates_what_the_job_owns_after_it_and_a_refused_role_says_how_to_do_without(
    api: FakeKubeAPI, backend: K8sBackend
) -> None:
    backend.schedule(_prepared(backend))
    posts = [(r.path.rsplit("/", 1)[-1], r.body["metadata"]) for r in api.requests if r.method == "POST"]
    assert [p for p, _ in posts] == ["pytorchjobs", "serviceaccounts", "roles", "rolebindings"]
    uid = api.store[(PLURAL, NS, JOB)]["metadata"]["uid"]
    assert all(meta["ownerReferences"][0]["uid"] == uid for _, meta in posts[1:]), "deleting the job deletes them"
    role = api.objects[("roles", NS, f"{JOB}-dist-jobs")]
    assert role["rules"] == [
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "resourceNames": [JOB], "verbs": ["get", "patch"]}
    ]
    template = api.store[(PLURAL, NS, JOB)]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert template["serviceAccountName"] == f"{JOB}-dist-jobs"
    api.forbidden = {"roles"}
    backend.stop(JOB)
    api.objects.clear()  # the garbage collector's part: they were the job's
    error = _error(backend.schedule, _prepared(backend))
    assert f"create Role {NS}/{JOB}-dist-jobs: roles.rbac.authorization.k8s.io is forbidden" in error.message
    assert "k8s.avoid_failed_nodes: false" in error.hint
    assert (PLURAL, NS, JOB) not in api.store, "the job whose pods could not keep a node away is deleted again"
    api.objects.clear()
    backend.schedule(_prepared(backend, {**SEED, "k8s": {**SEED["k8s"], "avoid_failed_nodes": False}}))
    assert [k[0] for k in api.objects] == [] and "serviceAccountName" not in api.store[(PLURAL, NS, JOB)]["spec"][
        "pytorchReplicaSpecs"
    ]["Worker"]["template"]["spec"]


def test_status_names_the_nodes_a_running_job_keeps_away_and_why(
    api: FakeKubeAPI, backend: K8sBackend, tmp_path: Path
) -> None:
    backend.schedule(_prepared(backend, {**SEED, "checkpoint_dir": str(tmp_path)}))
    stored = api.store[(PLURAL, NS, JOB)]
    submission = stored["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"][
        "dist-jobs/submission"
    ]
    for replica in stored["spec"]["pytorchReplicaSpecs"].values():  # as the blamed pod patched it
        replica["template"]["spec"]["affinity"] = avoiding(replica["template"]["spec"], ["n2"])
    assert backend.status(JOB).extra["kept_away"] == "n2"  # the apiserver's word, before the record is read
    cause = "rank 1 killed by SIGKILL on train-worker-0"
    verdict = Verdict(Ending.RANK_KILLED, Action.REQUEUE, 200, cause, node="n2")
    keep_away(tmp_path / JOB, submission, verdict, now=1000.0)
    status = backend.status(JOB)
    assert status.extra["kept_away"].startswith(f"n2 ({cause}; until ")
    assert "keeps away from n2 (" in status.detail
