"""A Kubernetes sweep run by the operator harness: `dist-jobs sweep --backend k8s` creates one
labelled PyTorchJob per trial through the real client, and each one, played by the harness (pods
as processes with the operator's environment), trains its own trial in its own run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dist_jobs.cli import main
from support.k8s_offline.crds import crd_path
from support.kube_standin import FakeKubeAPI, write_kubeconfig
from support.operator_harness import Operator
from support.paths import REPO, TESTS
from support.tiers import require_module, requires
from support.waiting import HUNG_S

require_module("kubernetes")

pytestmark = [requires("pods"), pytest.mark.timeout(400)]

NAME = "hsweep"


def test_each_trial_is_a_labelled_pytorchjob_that_trains_its_own_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow by nature: each of the two trials trains in the operator harness, one after the other."""
    monkeypatch.chdir(tmp_path)  # the manifest goes to ./dist-jobs-sweeps/NAME
    data = {
        "name": NAME,
        "nodes": 2,
        "gpus_per_node": 0,
        "procs_per_node": 1,
        "checkpoint_dir": "ckpt",
        "image": "local/dist-jobs:test",
        # The pods' python path: this checkout's dist_jobs and the tests' small model.
        "env": {"DIST_JOBS_RDZV_TIMEOUT": "60", "PYTHONPATH": f"{REPO}:{TESTS}"},
        "train": {
            "model": "support.workloads:tiny_net",
            "image_size": 8,
            "fake_samples": 32,
            "epochs": 1,
            "batch_size": 8,
        },
        "k8s": {"pvc": "shared", "mount_path": str(tmp_path / "shared")},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    with FakeKubeAPI([crd_path("PyTorchJob")]) as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        argv = ["sweep", "--backend", "k8s", "--kubeconfig", str(kubeconfig), str(tmp_path / "job.yaml")]
        assert main([*argv, "--grid", "train.lr=0.2,0.02", "-o", "json"]) == 0, capsys.readouterr().err
        trials = json.loads(capsys.readouterr().out)["trials"]
        jobs = [api.store[("pytorchjobs", "default", f"{NAME}-t{i}")] for i in range(2)]
        assert [t["handle"] for t in trials] == [f"k8s://default/PyTorchJob/{NAME}-t{i}" for i in range(2)]
        for index, job in enumerate(jobs):
            labels = job["metadata"]["labels"]
            assert (labels["dist-jobs/sweep"], labels["dist-jobs/trial"]) == (NAME, str(index))
            container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
            assert f"--lr={(0.2, 0.02)[index]}" in container["command"], container["command"]
            logs = tmp_path / f"logs-{index}"
            logs.mkdir()
            with Operator(job, logs) as operator:
                assert operator.run(timeout=HUNG_S) == "Succeeded", operator.attempts[-1].text()[-3000:]
        # The volume is mounted at the same path here: the table has each trial's own numbers.
        assert main(["sweep", "status", NAME, "-o", "json"]) == 0, capsys.readouterr().err
        rows = json.loads(capsys.readouterr().out)
    for index, row in enumerate(rows):  # each trial its own run directory, under the sweep's folder
        assert row["run_dir"] == str(tmp_path / "shared" / "ckpt" / NAME / f"{NAME}-t{index}")
        assert (row["step"], row["metric"]) == (2, "eval_loss")  # 32 samples / (2 ranks x 8)
    assert sum(r["is_best"] for r in rows) == 1
    assert (tmp_path / "dist-jobs-sweeps" / NAME / "sweep.json").is_file()
