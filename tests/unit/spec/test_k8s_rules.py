"""Kubernetes' syntax and the operators' rules, checked when a spec is loaded for `--backend k8s`:
exit 2 with every problem at once (field, value, fix), before anything reaches a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.cli import main
from dist_jobs.errors import SpecError
from dist_jobs.render import render
from dist_jobs.spec import k8s_names as names
from dist_jobs.spec.load import load_spec
from support.k8s_offline.validate import crd_path, validate

GOOD = {"name": "rules", "nodes": 2, "gpus_per_node": 1, "image": "reg.example/team/train:1", "k8s": {"pvc": "ckpt"}}

# The fifteen illegal specs, all at once, and what each must be reported as.
ILLEGAL: dict[str, Any] = {
    **GOOD,
    "image": "Reg.Example/Team/Train:1",
    # RANK, WORLD_SIZE, MASTER_ADDR are refused on every backend (spec/reserved.py); these only here.
    "env": {"PYTHONUNBUFFERED": "0", "PET_NNODES": "2", "PET_NODE_RANK": "1"},
    "k8s": {
        "namespace": "My_NS",
        "labels": {"bad key!": "ok", "team": "bad value!", "-lead": "x"},
        "annotations": {"no/pe/x": "v"},
        "tolerations": [
            {"key": "gpu", "operator": "Exists", "value": "yes"},
            {"operator": "Equal", "value": "x"},
            {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 60},
        ],
        "node_selector": {"gpu": "A100 80GB"},
        "gpu_resource": "gpu",
        "service_account": "Trainer_SA",
        "pvc": "My_PVC",
        "mount_path": "/dev/shm",
        "restart_policy": "Always",
    },
}
EXPECTED_FIELDS = [
    "image",
    "k8s.namespace",
    "k8s.labels (key)",
    "k8s.labels (value)",
    "k8s.annotations (key)",
    "k8s.service_account",
    "k8s.pvc",
    "k8s.node_selector (value)",
    "k8s.gpu_resource",
    "k8s.mount_path",
    "k8s.tolerations[0].value",
    "k8s.tolerations[1].operator",
    "k8s.tolerations[2].effect",
    "env.PET_NNODES",
    "env.PET_NODE_RANK",
    "env.PYTHONUNBUFFERED",
    "k8s.restart_policy",
]


def _problems(data: dict[str, Any]) -> list[tuple[str, object]]:
    with pytest.raises(SpecError) as err:
        load_spec(data=data, backend="k8s")
    return [(p.field, p.value) for p in err.value.problems]


def test_every_problem_at_once_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(ILLEGAL))
    assert main(["render", "--backend", "k8s", str(spec)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    reported = [line.split(":")[0].strip("- ") for line in err.splitlines() if line.startswith("  - ")]
    assert sorted(set(reported)) == sorted(EXPECTED_FIELDS), err
    assert err.count("\n    fix: ") == len(reported)  # every problem says how to fix it
    assert "(given: 'My_NS')" in err and "(given: 'My_PVC')" in err and "(given: 'gpu')" in err
    # Kubernetes' rules are Kubernetes': the same spec is a fine SLURM job.
    assert main(["render", "--backend", "slurm", str(spec)]) == 0


def test_the_good_spec_passes_and_its_manifest_fits_the_crd() -> None:
    doc = yaml.safe_load(render(load_spec(data=GOOD, backend="k8s"), "k8s"))
    assert validate(doc, crd_path("PyTorchJob")) == []


def test_render_checks_too_when_the_api_loaded_the_spec_without_a_backend() -> None:
    spec = load_spec(data={**GOOD, "k8s": {"namespace": "My_NS"}})  # no backend: not checked yet
    with pytest.raises(SpecError, match="k8s.namespace"):
        render(spec, "k8s")


def test_backoff_limit_under_exit_code_is_explained_not_rendered() -> None:
    (problem,) = _problems({**GOOD, "k8s": {"backoff_limit": 4}})
    assert problem == ("k8s.backoff_limit", 4)
    spec = load_spec(data={**GOOD, "k8s": {"backoff_limit": 4, "restart_policy": "OnFailure"}}, backend="k8s")
    assert yaml.safe_load(render(spec, "k8s"))["spec"]["runPolicy"]["backoffLimit"] == 4


def test_trainjob_reserved_env_and_name_limit() -> None:
    trainjob = {**GOOD, "k8s": {"api": "trainjob", "pvc": "ckpt"}}
    found = _problems({**trainjob, "env": {"PET_NODE_RANK": "1"}, "name": "n" * 49})
    # PET_* is the trainer's own (RANK and friends are refused on every backend: spec/reserved.py)
    assert sorted(found) == [("env.PET_NODE_RANK", "1"), ("name", "n" * 49)]
    assert names.trainjob_name_limit(2) == 48 and names.trainjob_name_limit(11) == 47
    load_spec(data={**trainjob, "name": "n" * 48}, backend="k8s")  # 48 + "-node-0-1-abcde" = 63
    assert len(f"{'n' * 48}-node-0-1-abcde") == 63


# Each K8sSpec / JobSpec setting a PyTorchJob renders, with a non-default value.
SETTINGS: dict[str, Any] = {
    "k8s.namespace": "ml",
    "k8s.image_pull_secrets": ["regcred"],
    "k8s.service_account": "trainer",
    "k8s.pvc": "ckpt",
    "k8s.mount_path": "/data",
    "k8s.shm_size": "3Gi",
    "k8s.node_selector": {"pool": "a100"},
    "k8s.tolerations": [{"key": "g", "operator": "Exists", "effect": "NoSchedule"}],
    "k8s.labels": {"team": "ml"},
    "k8s.annotations": {"example.com/owner": "me"},
    "k8s.active_deadline_seconds": 999,
    "k8s.gpu_resource": "amd.com/gpu",
    "k8s.cpu_request": "7",
    "k8s.memory_request": "9Gi",
    "preemption.grace_seconds": 333,
    "k8s.priority_class": "high",
    "k8s.queue": "team-q",
    "k8s.ttl_seconds_after_finished": 77,
    "k8s.image_pull_policy": "Always",
    "k8s.restart_policy": "OnFailure",
    "k8s.backoff_limit": 5,
    "k8s.max_restarts": 2,
    "master_port": 29999,
    "workdir": "/app",
}


def _with(setting: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {**GOOD, "k8s": {"api": "trainjob", "pvc": "ckpt"}}
    section, _, key = setting.rpartition(".")
    if section:
        data[section] = {**data.get(section, {}), key: value}
    else:
        data[key] = value
    return data


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in (str(k), *_leaves(v))]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [str(value)]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_trainjob_carries_or_refuses_every_setting_never_drops_one(setting: str) -> None:
    data = _with(setting, SETTINGS[setting])
    try:
        spec = load_spec(data=data, backend="k8s")
    except SpecError as err:
        assert [p.field for p in err.problems] == [setting], err
        assert "TrainJob" in str(err) and "fix:" in str(err)
        return
    doc = yaml.safe_load(render(spec, "k8s"))
    assert validate(doc, crd_path("TrainJob")) == []
    text = yaml.safe_dump(doc)
    assert all(leaf in text for leaf in _leaves(SETTINGS[setting])), f"{setting} was dropped"


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (names.dns1123_label, ["ml", "a-b", "a" * 63], ["My_NS", "-a", "a" * 64, ""]),
        (names.dns1123_subdomain, ["a.b-c", "trainer"], ["My_PVC", "a..b", "a_b"]),
        (names.qualified_name, ["team", "example.com/team", "A_b.c"], ["bad key!", "/x", "a/", "-x", "x/y/z"]),
        (names.label_value, ["", "A100", "a_b.c-d"], ["A100 80GB", "-x", "a" * 64]),
        (names.extended_resource, ["nvidia.com/gpu", "amd.com/gpu"], ["gpu", "kubernetes.io/gpu", "a/b c"]),
        (
            names.image_reference,
            ["python:3.11", "reg.example:5000/team/train:1", "ghcr.io/a/b@sha256:" + "a" * 64, "ubuntu"],
            ["Reg.Example/Team/Train:1", "a b", "repo:", "team/Train"],
        ),
    ],
)
def test_name_rules(rule: Any, good: list[str], bad: list[str]) -> None:
    assert {g: rule(g) for g in good} == dict.fromkeys(good, "")
    assert all(rule(b) for b in bad), {b: rule(b) for b in bad}


def test_home_in_checkpoint_dir_is_refused_for_a_pod() -> None:
    """`~/ck` became a folder named `~` under the volume's mount path: no pod has the submitter's home."""
    assert _problems({**GOOD, "checkpoint_dir": "~/ck"}) == [("checkpoint_dir", "~/ck")]
    assert load_spec(data={**GOOD, "checkpoint_dir": "ck/~x"}, backend="k8s").checkpoint_dir == "ck/~x"
