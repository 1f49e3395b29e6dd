"""A sweep on the real kube-apiserver tier: one PyTorchJob per trial, each labelled with the sweep
and its trial, found by label; the manifest stays on this machine and `sweep status` reads the
trials' state from the apiserver by their handles."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from support import apiserver_tier
from support.paths import PYTHON, REPO
from support.tiers import requires
from support.waiting import HUNG_S

pytestmark = [requires("apiserver"), pytest.mark.slow]


def dj(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, timeout=HUNG_S, cwd=cwd)


def test_one_labelled_pytorchjob_per_trial(tmp_path: Path) -> None:
    kubeconfig = apiserver_tier.require_apiserver()
    name = f"sw-{uuid.uuid4().hex[:6]}"
    spec = str(REPO / "k8s/examples/resnet-2x4.yaml")
    args = [
        "sweep",
        "--backend",
        "k8s",
        spec,
        "--name",
        name,
        "--namespace",
        "default",
        "--kubeconfig",
        str(kubeconfig),
    ]
    sub = dj(tmp_path, *args, "--grid", "train.lr=0.1,0.01,0.001", "-o", "json")
    assert sub.returncode == 0, sub.stderr
    from kubernetes import client

    with apiserver_tier.kube_client() as api:
        custom = client.CustomObjectsApi(api)
        try:
            found = custom.list_namespaced_custom_object(
                "kubeflow.org", "v1", "default", "pytorchjobs", label_selector=f"dist-jobs/sweep={name}"
            )["items"]
            trials = {o["metadata"]["labels"]["dist-jobs/trial"]: o["metadata"]["name"] for o in found}
            assert trials == {"0": f"{name}-t0", "1": f"{name}-t1", "2": f"{name}-t2"}
            handles = [t["handle"] for t in json.loads(sub.stdout)["trials"]]
            assert handles == [f"k8s://default/PyTorchJob/{name}-t{i}" for i in range(3)]
            assert (tmp_path / "dist-jobs-sweeps" / name / "sweep.json").is_file()  # not in the pods' volume
            status = dj(tmp_path, "sweep", "status", name, "-o", "json")
            assert status.returncode == 0, status.stderr
            rows = json.loads(status.stdout)
            assert [r["params"] for r in rows] == [{"train.lr": v} for v in (0.1, 0.01, 0.001)]
            assert all(r["state"] in ("pending", "running") for r in rows), rows  # no operator runs here
        finally:
            for i in range(3):
                custom.delete_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", f"{name}-t{i}")
