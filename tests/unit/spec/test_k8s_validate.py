"""support.k8s_offline.validate against the facts in KUBERNETES_NOTES.md: five broken PyTorchJobs and a
good one, caught (or, where the real apiserver accepts them, accepted) the same way, with the
apiserver's error strings."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.errors import DistJobsError, UsageError
from support.k8s_offline import validate as kv
from support.kube_standin import sample_pytorchjob

_NUM = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = rf"^(\+|-)?{_NUM}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUM}))?$"  # the CRD's Quantity pattern
W = "spec.pytorchReplicaSpecs.Worker"  # kube-openapi's path style: map keys joined with '.'


def _container(job: dict[str, Any], role: str) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]


def _strs(errors: list[kv.FieldError]) -> list[str]:
    return [str(e) for e in errors]


# --- the notes' six samples -----------------------------------------------------------------


def test_good_sample_with_integer_quantities_is_valid_and_admitted() -> None:
    job = sample_pytorchjob()
    assert kv.validate(job) == []
    assert kv.admission_errors(job) == []


def test_typo_volumemount_is_an_unknown_field_strict_and_silently_pruned_otherwise() -> None:
    job = sample_pytorchjob()
    c = _container(job, "Worker")
    c["volumeMount"] = c.pop("volumeMounts")
    path = f"{W}.template.spec.containers[0].volumeMount"
    assert _strs(kv.validate(job)) == [f'unknown field "{path}"']
    assert kv.validate(job)[0].reason == "UnknownField"
    assert kv.validate(job, strict=False) == []  # what the apiserver does by default: 201
    stored, unknown = kv.prune_and_default(job)
    assert unknown == [path]
    assert "volumeMount" not in _container(stored, "Worker")
    assert "volumeMount" in _container(job, "Worker"), "the caller's object must not be mutated"


def test_wrong_types_replicas_two_and_memory_lots_are_both_caught() -> None:
    job = sample_pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    _container(job, "Worker")["resources"]["limits"]["memory"] = "lots"
    mem = f"{W}.template.spec.containers[0].resources.limits.memory"
    assert _strs(kv.validate(job)) == [
        f'{W}.replicas: Invalid value: "string": {W}.replicas in body must be of type integer: "string"',
        f"{mem}: Invalid value: \"lots\": {mem} in body should match '{QUANTITY}'",
        # Worker.replicas is the scale subresource's specReplicasPath: read as int64 too
        f".{W}.replicas: Invalid value: 0: .{W}.replicas accessor error: two is of the type string, expected int64",
    ]
    reasons = [e.reason for e in kv.validate(job)]
    assert reasons == ["FieldValueTypeInvalid", "FieldValueInvalid", "FieldValueInvalid"]


def test_container_without_name_and_duplicate_env_name_are_caught() -> None:
    job = sample_pytorchjob()
    c = _container(job, "Master")
    del c["name"]
    c["env"] += [{"name": "DIST_JOBS_BACKEND", "value": "slurm"}]
    errors = kv.validate(job)
    assert _strs(errors) == [
        "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].name: Required value",
        # list-type errors use field.Path, which brackets map keys
        "spec.pytorchReplicaSpecs[Master].template.spec.containers[0].env[1]: "
        'Duplicate value: map[string]interface {}{"name":"DIST_JOBS_BACKEND"}',
    ]
    assert [e.reason for e in errors] == ["FieldValueRequired", "FieldValueDuplicate"]


def test_no_pytorch_container_and_master_replicas_2_pass_the_schema_but_not_the_webhook() -> None:
    job = sample_pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    _container(job, "Master")["name"] = "trainer"
    assert kv.validate(job) == []  # the real apiserver's schema accepts it too; its webhook says 403
    assert kv.admission_errors(job) == [
        "spec.pytorchReplicaSpecs[Master].template.spec.containers: Required value: "
        "must have at least one container with name pytorch",
        "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1",
    ]


def test_bad_enum_values_are_accepted_because_the_crd_has_no_enums() -> None:
    job = sample_pytorchjob()
    _container(job, "Master")["imagePullPolicy"] = "Sometimes"
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"][0]["emptyDir"]["medium"] = "RAM"
    # the real apiserver answers 201: only the operator's later Pod create fails
    assert kv.validate(job) == []
    assert kv.admission_errors(job) == []


# --- pruning and defaulting ------------------------------------------------------------------


def test_defaults_are_applied_before_list_map_keys_are_compared() -> None:
    job = sample_pytorchjob()
    _container(job, "Master")["ports"] = [
        {"name": "pytorchjob-port", "containerPort": 23456},
        {"name": "other", "containerPort": 23456, "protocol": "TCP"},
    ]
    stored, _ = kv.prune_and_default(job)
    assert _container(stored, "Master")["ports"][0]["protocol"] == "TCP"
    assert _strs(kv.validate(job)) == [
        "spec.pytorchReplicaSpecs[Master].template.spec.containers[0].ports[1]: Duplicate value: "
        'map[string]interface {}{"containerPort":23456, "protocol":"TCP"}'
    ]


def test_defaults_only_fill_objects_that_exist() -> None:
    job = sample_pytorchjob()
    stored, _ = kv.prune_and_default(job)
    assert "runPolicy" not in stored["spec"]
    job["spec"]["runPolicy"] = {}
    stored, _ = kv.prune_and_default(job)
    assert stored["spec"]["runPolicy"]["suspend"] is False


def test_status_is_dropped_and_unknown_metadata_fields_are_reported() -> None:
    job = sample_pytorchjob()
    job["status"] = {"conditions": []}
    job["metadata"]["labelz"] = {"a": "b"}
    stored, unknown = kv.prune_and_default(job)
    assert "status" not in stored and "labelz" not in stored["metadata"]
    assert unknown == ["metadata.labelz"]


def test_non_nullable_nulls_are_dropped_not_rejected() -> None:
    job = sample_pytorchjob()
    job["spec"]["runPolicy"] = {"backoffLimit": None, "suspend": None}
    stored, _ = kv.prune_and_default(job)
    assert stored["spec"]["runPolicy"] == {"suspend": False}  # null with a default gets the default
    assert kv.validate(job) == []


# --- metadata and type meta ------------------------------------------------------------------


def test_bad_metadata_name_and_labels_read_like_the_apiserver() -> None:
    job = sample_pytorchjob()
    job["metadata"]["name"] = "Bad_Name"
    job["metadata"]["labels"] = {"bad key!": "ok", "ok": "bad value!"}
    assert _strs(kv.validate(job)) == [
        'metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist of lower case '
        "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
        "'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        'metadata.labels: Invalid value: "bad key!": name part must consist of alphanumeric characters, '
        "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
        "'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        'metadata.labels: Invalid value: "bad value!": a valid label must be an empty string or consist of '
        "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character "
        "(e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is "
        "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
    ]


def test_name_is_required_unless_generate_name_is_given() -> None:
    job = sample_pytorchjob()
    del job["metadata"]["name"]
    assert _strs(kv.validate(job)) == ["metadata.name: Required value: name or generateName is required"]
    job["metadata"]["generateName"] = "llm-train-"
    assert kv.validate(job) == []


def test_long_name_and_label_value_report_length() -> None:
    job = sample_pytorchjob()
    job["metadata"]["name"] = "a" * 254
    job["metadata"]["labels"] = {"k": "v" * 64}
    assert [e.message.split(": ", 2)[-1] for e in kv.validate(job)] == [
        "must be no more than 253 characters",
        "must be no more than 63 characters",
    ]


def test_non_string_name_and_bad_namespace() -> None:
    job = sample_pytorchjob()
    job["metadata"]["name"] = 123  # an unquoted YAML number
    assert _strs(kv.validate(job)) == ['metadata.name: Invalid value: "integer": metadata.name must be of type string']
    job = sample_pytorchjob(namespace="ml.team")
    assert _strs(kv.validate(job)) == ['metadata.namespace: Invalid value: "ml.team": must not contain dots']


def test_wrong_kind_and_api_version_stop_validation_early() -> None:
    job = sample_pytorchjob()
    job["kind"], job["apiVersion"] = "TFJob", "kubeflow.org/v2"
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    assert _strs(kv.validate(job, kv.crd_path("PyTorchJob"))) == [
        'kind: Invalid value: "TFJob": must be PyTorchJob',
        'apiVersion: Invalid value: "kubeflow.org/v2": must be kubeflow.org/v1',
    ]


def test_missing_spec_is_required() -> None:
    job = sample_pytorchjob()
    job["spec"] = {}
    assert _strs(kv.validate(job)) == ["spec.pytorchReplicaSpecs: Required value"]


# --- webhook rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda j: j["metadata"].update(name="1-job"),
            'metadata.name: Invalid value: "1-job": should match: a DNS-1035 label must consist of lower case '
            "alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric "
            "character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"].pop("Worker")),
            'spec.pytorchReplicaSpecs[Chief]: Unsupported value: "Chief": supported values: "Master", "Worker"',
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].update(containers=[]),
            "spec.pytorchReplicaSpecs[Worker].template.spec.containers: Required value: must be specified",
        ),
        (
            lambda j: _container(j, "Worker").pop("image"),
            "spec.pytorchReplicaSpecs[Worker].template.spec.containers[0].image: Required value: must be required",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].pop("replicas"),
            "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=0),
            "spec.pytorchReplicaSpecs[Worker].replicas: Forbidden: must be at least 1",
        ),
        (
            lambda j: j["spec"].update(elasticPolicy={"nProcPerNode": 2}, nprocPerNode="2"),
            "spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with spec.nprocPerNode",
        ),
        (
            lambda j: j["spec"].update(runPolicy={"managedBy": "me"}),
            'spec.runPolicy.managedBy: Unsupported value: "me": supported values: '
            '"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"',
        ),
        (lambda j: j.update(spec={}), "spec.pytorchReplicaSpecs: Required value: must be required"),
    ],
)
def test_each_webhook_rule(mutate: Any, expected: str) -> None:
    job = sample_pytorchjob()
    mutate(job)
    assert expected in kv.admission_errors(job)


def test_elastic_policy_needs_a_worker() -> None:
    job = sample_pytorchjob()
    del job["spec"]["pytorchReplicaSpecs"]["Worker"]
    job["spec"]["elasticPolicy"] = {"minReplicas": 1}
    assert kv.admission_errors(job) == [
        "spec.pytorchReplicaSpecs[Worker]: Required value: must be configured if elastic policy is used"
    ]


# --- the other two CRDs ----------------------------------------------------------------------


def test_trainjob_defaults_and_minimum() -> None:
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "activeDeadlineSeconds": 0},
    }
    stored, _ = kv.prune_and_default(job)
    assert stored["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert _strs(kv.validate(job)) == [
        "spec.activeDeadlineSeconds: Invalid value: 0: spec.activeDeadlineSeconds in body should be "
        "greater than or equal to 1"
    ]


def test_jobset_duplicate_replicated_job_names() -> None:
    rjob = {
        "name": "workers",
        "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}},
    }
    js = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {"replicatedJobs": [rjob, copy.deepcopy(rjob)]},
    }
    stored, _ = kv.prune_and_default(js)
    assert stored["spec"]["replicatedJobs"][0]["replicas"] == 1
    assert _strs(kv.validate(js)) == [
        'spec.replicatedJobs[1]: Duplicate value: map[string]interface {}{"name":"workers"}'
    ]


# --- schema features the vendored CRDs use rarely or not at all ------------------------------

_SYNTHETIC = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              description: {type: string, maxLength: 5, description: a field named description}
              mode: {type: string, enum: [fast, slow]}
              note: {type: string, nullable: true}
              port: {x-kubernetes-int-or-string: true}
              tags: {type: array, maxItems: 2, items: {type: string}, x-kubernetes-list-type: set}
              extra: {type: object, x-kubernetes-preserve-unknown-fields: true,
                      properties: {known: {type: integer}}}
              sizes: {type: object, additionalProperties: {type: integer, minimum: 0}}
"""


@pytest.fixture()
def widget_crd(tmp_path: Path) -> Path:
    path = tmp_path / "widgets.yaml"
    path.write_text(_SYNTHETIC, encoding="utf-8")
    return path


def _widget(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


def test_synthetic_schema_features(widget_crd: Path) -> None:
    ok = _widget(
        {
            "description": "short",
            "note": None,
            "port": 8080,
            "tags": ["a"],
            "extra": {"known": 1, "anything": {"goes": True}},
            "sizes": {"a": 1},
        }
    )
    assert kv.validate(ok, widget_crd) == []
    assert kv.validate(_widget({"port": "http"}), widget_crd) == []
    bad = _widget(
        {
            "description": "too long",
            "mode": "warp",
            "port": True,
            "tags": ["a", "b", "a"],
            "extra": {"known": "x"},
            "sizes": {"a": -1},
        }
    )
    assert _strs(kv.validate(bad, widget_crd)) == [
        "spec.description: Too long: may not be more than 5 bytes",
        'spec.mode: Unsupported value: "warp": supported values: "fast", "slow"',
        'spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"',
        "spec.tags: Too many: 3: must have at most 2 items",
        'spec.extra.known: Invalid value: "string": spec.extra.known in body must be of type integer: "string"',
        "spec.sizes.a: Invalid value: -1: spec.sizes.a in body should be greater than or equal to 0",
        'spec.tags[2]: Duplicate value: "a"',
    ]


def test_preserve_unknown_fields_keeps_unknown_keys(widget_crd: Path) -> None:
    stored, unknown = kv.prune_and_default(_widget({"extra": {"anything": 1}, "typo": 2}), widget_crd)
    assert stored["spec"] == {"extra": {"anything": 1}}
    assert unknown == ["spec.typo"]


# --- API contract ----------------------------------------------------------------------------


def test_field_error_is_frozen_and_renders_like_the_apiserver() -> None:
    err = kv.FieldError("spec.x", "FieldValueRequired", "Required value")
    assert str(err) == "spec.x: Required value"
    with pytest.raises(AttributeError):
        err.field = "other"  # type: ignore[misc]


def test_unknown_kind_and_missing_crd_raise_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no vendored CRD"):
        kv.crd_path("TFJob")
    with pytest.raises(UsageError, match="must be a mapping"):
        kv.validate(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(DistJobsError, match="cannot read CRD"):
        kv.validate(sample_pytorchjob(), tmp_path / "absent.yaml")


def test_validator_is_compiled_once_and_validation_is_fast() -> None:
    job = sample_pytorchjob()
    kv.validate(job)  # load + compile (cached per CRD path and version)
    start = time.perf_counter()
    for _ in range(20):
        assert kv.validate(job) == []
    per_object = (time.perf_counter() - start) / 20
    assert per_object < 0.05, f"{per_object * 1000:.1f} ms per object: is the compiled validator cached?"
