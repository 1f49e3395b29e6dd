"""The operator harness decides as training-operator v1.9 does (its source, KUBERNETES_NOTES section
5), shown with tiny shell pods: no cap on ExitCode restarts whatever backoffLimit says, except 0,
which fails even a preemption; the Master decides success; cleanPodPolicy None leaves the other
pods running. And what dist-jobs adds on top, through the rendered pod entrypoint: the restart
cap counted in the run directory, and values that reach the process exactly as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.cli import main
from dist_jobs.constants import REQUEUE_EXIT_CODE, REQUEUE_LIMIT_EXIT_CODE
from support.k8s_offline.crds import crd_path
from support.kube_standin import FakeKubeAPI, write_kubeconfig
from support.operator_harness import Operator
from support.tiers import require_module, requires
from support.waiting import HUNG_S

require_module("kubernetes")

pytestmark = [requires("pods"), pytest.mark.timeout(120)]

# Exit 200 (the retryable code) four times, then 0; the count lives in the pod's working directory.
FLAKY = "n=$$(cat count 2>/dev/null || echo 0); echo $$((n + 1)) > count; [ $$n -ge 4 ] && exit 0; exit 200"


def job(tmp_path: Path, replicas: dict[str, str], policy: str = "ExitCode", backoff: int | None = None) -> dict:
    """A PyTorchJob whose replica types run the given `sh -c` scripts (written as a manifest author must: `$$`)."""
    specs = {}
    for rtype, script in replicas.items():
        workdir = tmp_path / rtype
        workdir.mkdir()
        container = {"name": "pytorch", "image": "i:1", "command": ["sh", "-c", script], "workingDir": str(workdir)}
        specs[rtype] = {"replicas": 1, "restartPolicy": policy, "template": {"spec": {"containers": [container]}}}
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None"}
    if backoff is not None:
        run_policy["backoffLimit"] = backoff
    return {"metadata": {"name": "hj"}, "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": specs}}


def operate(tmp_path: Path, manifest: dict) -> Operator:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return Operator(manifest, tmp_path / "logs")


def test_exit_code_restarts_have_no_cap_whatever_backoff_limit(tmp_path: Path) -> None:
    with operate(tmp_path, job(tmp_path, {"Master": FLAKY}, backoff=2)) as operator:
        assert operator.run(timeout=HUNG_S) == "Succeeded"
    assert [a.code for a in operator.attempts] == [REQUEUE_EXIT_CODE] * 4 + [0]  # 4 restarts past backoffLimit 2


def test_backoff_limit_0_fails_the_job_on_a_preemption(tmp_path: Path) -> None:
    with operate(tmp_path, job(tmp_path, {"Master": FLAKY}, backoff=0)) as operator:
        assert operator.run(timeout=HUNG_S) == "Failed"
    assert [a.code for a in operator.attempts] == [REQUEUE_EXIT_CODE]


def test_on_failure_restarts_count_against_backoff_limit(tmp_path: Path) -> None:
    with operate(tmp_path, job(tmp_path, {"Master": "exit 1"}, policy="OnFailure", backoff=2)) as operator:
        assert operator.run(timeout=HUNG_S) == "Failed"
    assert [a.code for a in operator.attempts] == [1, 1, 1]


@pytest.mark.parametrize(("master", "condition"), [("exit 0", "Succeeded"), ("exit 1", "Failed")])
def test_the_master_ends_the_job_and_the_other_pods_keep_running(tmp_path: Path, master: str, condition: str) -> None:
    """cleanPodPolicy None: the operator deletes nothing when the job ends (a Worker keeps its GPUs)."""
    with operate(tmp_path, job(tmp_path, {"Master": master, "Worker": "sleep 60"})) as operator:
        assert operator.run(timeout=HUNG_S) == condition
        worker = operator.current("hj-worker-0")
        assert worker.process.poll() is None and worker.code is None
        operator.kill("hj-worker-0")
        operator.poll()
        assert len(operator.attempts) == 2  # the job has ended: nothing is restarted


def submit(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """`dist-jobs submit --backend k8s` to the stand-in; what the apiserver stored."""
    with FakeKubeAPI([crd_path("PyTorchJob")]) as api:
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(data))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        assert main(["submit", "--backend", "k8s", "--kubeconfig", str(kubeconfig), str(path)]) == 0
        return api.store[("pytorchjobs", "default", data["name"])]


def direct(tmp_path: Path, command: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": "capped",
        "procs_per_node": 1,
        "image": "reg.example/train:1",
        "command": command,
        "checkpoint_dir": "ckpt",
        "k8s": {"launch": "direct", "pvc": "shared", "mount_path": str(tmp_path / "shared")},
        **extra,
    }


def test_the_pod_entrypoint_caps_restarts_at_max_requeues(tmp_path: Path) -> None:
    stored = submit(tmp_path, direct(tmp_path, ["sh", "-c", "exit 200"], preemption={"max_requeues": 2}))
    with operate(tmp_path, stored) as operator:
        assert operator.run(timeout=HUNG_S) == "Failed"
    assert [a.code for a in operator.attempts] == [REQUEUE_EXIT_CODE] * 3 + [REQUEUE_LIMIT_EXIT_CODE]
    last = operator.attempts[-1].text()
    assert "capped-master-0 has started 3 times for this submission and preemption.max_requeues is 2" in last
    submission = stored["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"]
    counted = tmp_path / "shared" / "ckpt" / "capped" / "attempts" / submission["dist-jobs/submission"]
    assert len((counted / "capped-master-0").read_text().splitlines()) == 3


def test_values_reach_the_process_as_written(tmp_path: Path) -> None:
    """`cost $$5` and `$(DIST_JOBS_RUN)` would arrive as `cost $5` and the run's name unescaped."""
    script = 'printf "%s|%s|%s\\n" "$A" "$B" "$1"'
    data = direct(tmp_path, ["sh", "-c", script, "sh", "--x=$(DIST_JOBS_RUN)"], env={"A": "cost $$5", "B": "$(A)"})
    with operate(tmp_path, submit(tmp_path, data)) as operator:
        assert operator.run(timeout=HUNG_S) == "Succeeded"
    assert "cost $$5|$(A)|--x=$(DIST_JOBS_RUN)\n" in operator.attempts[0].text()
