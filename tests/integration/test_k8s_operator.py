"""The operator's side of the contract: a PyTorchJob submitted with the real client to the stand-in
apiserver is played by tests/operator_harness.py (each pod a process in its own network
namespace, with exactly the operator's environment and the kubelet's expansion), trains to
completion with the right ranks, recovers from a preempted pod through restartPolicy ExitCode and
the shared checkpoint, recovers from a pod killed without warning (the gang restart of
k8s/README.md), and stops restarting at preemption.max_requeues, which the operator itself never does."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.cli import main
from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.errors import SpecError
from dist_jobs.render import render
from dist_jobs.rundir.holder import Holder
from dist_jobs.spec.load import load_spec
from support.k8s_offline.crds import crd_path
from support.kube_standin import FakeKubeAPI, write_kubeconfig
from support.lock_support import foreign, take_over
from support.operator_harness import Operator, defaulted, operator_env, pods, retries
from support.paths import REPO, TESTS
from support.specs import POD_TRAIN, paced
from support.tiers import require_module, requires
from support.waiting import HUNG_S, eventually

require_module("kubernetes")

JOB = "op-harness"


def spec(tmp_path: Path, **train: Any) -> dict[str, Any]:
    return {
        "name": JOB,
        "nodes": 2,
        "gpus_per_node": 0,
        "procs_per_node": 2,
        "checkpoint_dir": "ckpt",
        "image": "local/dist-jobs:test",
        # PYTHONPATH: the pods run this checkout's dist_jobs, as an image built from it would, and
        # the tests' models.
        "env": {"DIST_JOBS_RDZV_TIMEOUT": "60", "PYTHONPATH": f"{REPO}:{TESTS}"},
        "train": {**POD_TRAIN, **train},
        "k8s": {"pvc": "shared", "mount_path": str(tmp_path / "shared")},
    }


def mid_run(tmp_path: Path) -> dict[str, Any]:
    """A job that is still running when the test acts on it, after its first checkpoint: 64 steps
    (1024 samples / (2 ranks x 8)), a checkpoint every 4, and tiny_net sleeping 0.1 s in each
    training forward (wall time, no CPU). One rank per pod: the faults these tests make are the
    pods' (the ranks within a pod are test_submitted_job_trains_to_completion_with_pod_ranks's)."""
    return paced(spec(tmp_path), steps=64, seconds=0.1)


def manifest(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return yaml.safe_load(render(load_spec(path), "k8s"))


# -- harness calibration: the harness against the notes, no processes, no product code under test --


@pytest.mark.harness_calibration
def test_harness_calibration_operator_env_is_the_notes_table(tmp_path: Path) -> None:
    job = defaulted(manifest(tmp_path, spec(tmp_path)))
    job["spec"]["nprocPerNode"] = "8"  # the notes' example: 1 Master + 1 Worker, nprocPerNode 8
    master, worker = dict(operator_env(job, "Master", 0)), dict(operator_env(job, "Worker", 0))
    assert master == {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": f"{JOB}-master-0",
        "PET_MASTER_ADDR": f"{JOB}-master-0",
        "WORLD_SIZE": "16",
        "RANK": "0",
        "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "8",
        "PET_NNODES": "2",
    }
    assert (worker["RANK"], worker["PET_NODE_RANK"], worker["WORLD_SIZE"]) == ("1", "1", "16")
    del job["spec"]["nprocPerNode"]  # "auto" after defaulting: counted as 1
    assert dict(operator_env(defaulted(job), "Worker", 0))["WORLD_SIZE"] == "2"


def test_operator_env_wins_over_the_users_and_elastic_jobs_get_rdzv(tmp_path: Path) -> None:
    data = spec(tmp_path)
    with pytest.raises(SpecError, match="env.MASTER_PORT"):  # dist-jobs refuses what the operator would override
        load_spec(data={**data, "env": {"MASTER_PORT": "1"}}, backend="k8s")
    doc = manifest(tmp_path, data)
    for replica in doc["spec"]["pytorchReplicaSpecs"].values():  # a manifest written by hand
        replica["template"]["spec"]["containers"][0]["env"].append({"name": "MASTER_PORT", "value": "1"})
    (master, worker) = pods(doc)
    assert (master.name, worker.name) == (f"{JOB}-master-0", f"{JOB}-worker-0")
    assert master.env["MASTER_PORT"] == "23456" and master.restart_policy == "ExitCode"
    elastic = manifest(tmp_path, {**spec(tmp_path), "k8s": {"min_nodes": 1, "max_nodes": 3}})
    env = dict(operator_env(defaulted(elastic), "Worker", 0))
    assert env["PET_NNODES"] == "1:3" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"].startswith(f"{JOB}-")


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [
        ("ExitCode", REQUEUE_EXIT_CODE, True),
        ("ExitCode", 143, True),
        ("ExitCode", 137, True),
        ("ExitCode", 1, False),
        ("ExitCode", 127, False),
        ("ExitCode", 0, False),
        ("OnFailure", 1, True),
        ("Never", 200, False),
        ("Always", 0, True),
    ],
)
@pytest.mark.harness_calibration
def test_harness_calibration_restart_policies(policy: str, code: int, restart: bool) -> None:
    assert retries(policy, code) is restart


# -- real processes -----------------------------------------------------------------------------

needs_pods = requires("pods")


@pytest.fixture()
def submitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """Submit a spec with `dist-jobs submit --backend k8s` and return what the apiserver stored."""
    with FakeKubeAPI([crd_path("PyTorchJob")]) as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)

        def submit(data: dict[str, Any]) -> dict[str, Any]:
            path = tmp_path / "submitted.yaml"
            path.write_text(yaml.safe_dump(data))
            code = main(["submit", "--backend", "k8s", "--kubeconfig", str(kubeconfig), str(path)])
            assert code == 0, capsys.readouterr().err
            return api.store[("pytorchjobs", "default", JOB)]

        yield submit


def committed(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run_dir.glob("step-*") if (p / "COMPLETE").exists())


def first_checkpoint(operator: Operator, run_dir: Path) -> list[int]:
    """The committed steps once there is one; fails at once if a pod exits before."""
    return eventually(
        lambda: committed(run_dir),
        timeout=240,
        interval=0.05,
        what="a first committed checkpoint",
        give_up=lambda: [(a.pod, a.process.returncode) for a in operator.attempts if a.process.poll() is not None],
        context=lambda: operator.attempts[0].text()[-3000:],
    )


@needs_pods
@pytest.mark.timeout(300)
def test_submitted_job_trains_to_completion_with_pod_ranks(submitted: Any, tmp_path: Path) -> None:
    """Slow by nature: four ranks in two harness pods start torch and train the job to its end."""
    job = submitted(spec(tmp_path))
    (tmp_path / "logs").mkdir()
    with Operator(job, tmp_path / "logs") as operator:
        assert operator.run(timeout=HUNG_S) == "Succeeded", operator.attempts[-1].text()[-3000:]
    assert operator.restarts() == 0
    master, worker = (operator.current(f"{JOB}-{r}-0").text() for r in ("master", "worker"))
    line = "dist-jobs: rank {r}/4 node {n}/2 local {l}/2 master %s-master-0:23456 (torchrun, host %s-{p}-0)"
    for text, node, pod in ((master, 0, "master"), (worker, 1, "worker")):
        for local in (0, 1):
            want = (line % (JOB, JOB)).format(r=2 * node + local, n=node, l=local, p=pod)
            assert want in text, text[-3000:]
    run_dir = tmp_path / "shared" / "ckpt" / JOB
    assert committed(run_dir)[-1] == 4  # 64 samples / (4 ranks x 8) = 2 steps, 2 epochs
    assert sorted(p.name for p in (run_dir / "step-4").glob("rank-*.pt")) == [f"rank-{r}.pt" for r in range(4)]


@needs_pods
@pytest.mark.timeout(400)
def test_preempted_pod_exits_200_and_its_replacement_resumes(submitted: Any, tmp_path: Path) -> None:
    """Slow by nature: the 64-step job runs twice, as two gangs of pod processes: the first is evicted only
    after it has committed a checkpoint, and the replacements start torch and the rendezvous again before they
    train the rest."""
    job = submitted(mid_run(tmp_path))
    run_dir = tmp_path / "shared" / "ckpt" / JOB
    (tmp_path / "logs").mkdir()
    with Operator(job, tmp_path / "logs") as operator:
        first_checkpoint(operator, run_dir)
        held = json.loads((run_dir / "LOCK").read_text())  # pod rank 0's entrypoint holds the run directory
        assert (held["backend"], held["owner"]) == ("k8s", f"k8s:pytorchjob/default/{JOB}"), held
        operator.evict(f"{JOB}-master-0")
        phase = operator.finish(timeout=300)
    codes = operator.codes()
    assert phase == "Succeeded", [a.text()[-2000:] for a in operator.attempts]
    # Both pods stop at the same step boundary (any rank's signal stops every rank), exit with
    # the retryable code, and are replaced; the replacements finish.
    assert codes == {
        (f"{JOB}-master-0", 0): REQUEUE_EXIT_CODE,
        (f"{JOB}-worker-0", 0): REQUEUE_EXIT_CODE,
        (f"{JOB}-master-0", 1): 0,
        (f"{JOB}-worker-0", 1): 0,
    }
    first, second = operator.attempts[0].text(), operator.current(f"{JOB}-master-0").text()
    stopped = int(re.search(r"preempted by SIGTERM at step (\d+)", first).group(1))
    resumed = re.search(r"resumed from \S+: epoch 0, step (\d+) of \d+ in it, step (\d+) overall", second)
    assert resumed is not None, second[-3000:]
    assert 0 < stopped == int(resumed.group(2)) < 64  # nothing since the last step boundary lost
    assert committed(run_dir)[-1] == 64
    # Pod rank 0's entrypoint held the run directory lock in both attempts and released it.
    assert "without the run directory lock" not in first + second
    assert not (run_dir / "LOCK").exists()


@needs_pods
@pytest.mark.timeout(400)
def test_a_pod_killed_without_warning_restarts_the_gang_which_resumes(submitted: Any, tmp_path: Path) -> None:
    """k8s/README.md's gang restart: an OOM kill or a node loss gives no SIGTERM. The operator recreates
    the killed pod (137 is retryable); the survivors lose their peer, exit with the retryable code
    (not 1, which would fail the job), are recreated too, and the new gang resumes from the checkpoint.
    Slow by nature: the job runs twice: after the SIGKILL the worker's ranks only exit once they notice the
    lost peer, then both pods are recreated and start torch and the rendezvous again before they finish the 64
    steps from the checkpoint."""
    job = submitted(mid_run(tmp_path))
    run_dir = tmp_path / "shared" / "ckpt" / JOB
    (tmp_path / "logs").mkdir()
    with Operator(job, tmp_path / "logs") as operator:
        first_checkpoint(operator, run_dir)
        before = committed(run_dir)[-1]
        operator.kill(f"{JOB}-master-0")
        phase = operator.finish(timeout=300)
    codes = operator.codes()
    assert phase == "Succeeded", [a.text()[-2000:] for a in operator.attempts]
    assert codes == {
        (f"{JOB}-master-0", 0): 137,  # SIGKILL
        (f"{JOB}-worker-0", 0): REQUEUE_EXIT_CODE,  # lost its peer: retryable
        (f"{JOB}-master-0", 1): 0,
        (f"{JOB}-worker-0", 1): 0,
    }
    survivor = operator.attempts[1].text() if operator.attempts[1].pod.endswith("worker-0") else ""
    assert re.search(r"rank 1 lost a peer \(", survivor), survivor[-3000:]
    resumed = re.search(
        r"resumed from \S+: epoch 0, step \d+ of \d+ in it, step (\d+) overall",
        operator.current(f"{JOB}-master-0").text(),
    )
    assert resumed is not None and before <= int(resumed.group(1)) < 64
    assert committed(run_dir)[-1] == 64


@needs_pods
@pytest.mark.timeout(400)
def test_a_rank_that_stops_stepping_is_dumped_and_its_pods_restarted(
    submitted: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 3 (the worker pod's second process) stops stepping at its 7th batch, once
    (support/hang_support.py); every rank's hang watchdog dumps its threads' stacks into the pod's
    log and leaves the PREEMPTED marker, so both pod entrypoints exit 200 (torchrun alone would
    say 1), restartPolicy ExitCode recreates them, and the new gang resumes from the checkpoint of
    step 6 and finishes. `dist-jobs status` reads the run's progress from the pods' run directory.
    Slow by nature: the ranks must sit stalled until the watchdog's limit runs out (its 5 s floor, or 10
    times the recent step time if longer) and dump their stacks; then both pods are recreated and the job runs a
    second time, starting torch in every rank again."""
    train = {"fake_samples": 512, "epochs": 1, "eval_every_epoch": False, "log_every": 1}
    train.update(model="support.hang_support:stalling_net", hang_min_seconds=5, hang_factor=10)
    data = spec(tmp_path, **train)
    data["env"].update(
        DJ_TEST_HANG_MARKER=str(tmp_path / "stalled"),
        DJ_TEST_HANG_RANK="3",
        DJ_TEST_HANG_STEP="7",
    )
    job = submitted(data)
    run_dir = tmp_path / "shared" / "ckpt" / JOB
    (tmp_path / "logs").mkdir()
    with Operator(job, tmp_path / "logs") as operator:
        phase = operator.finish(timeout=300)
    codes = operator.codes()
    assert phase == "Succeeded", [a.text()[-3000:] for a in operator.attempts]
    assert codes == {
        (f"{JOB}-master-0", 0): REQUEUE_EXIT_CODE,
        (f"{JOB}-worker-0", 0): REQUEUE_EXIT_CODE,
        (f"{JOB}-master-0", 1): 0,
        (f"{JOB}-worker-0", 1): 0,
    }
    first = {a.pod: a.text() for a in operator.attempts if a.number == 0}
    worker, master = first[f"{JOB}-worker-0"], first[f"{JOB}-master-0"]
    assert "hang_support: rank 3 stops stepping at batch 7" in worker
    assert "rank 3: hang watchdog: no optimizer step completed for" in worker and "in stop_stepping" in worker
    assert "rank 0: hang watchdog: no optimizer step completed for" in master, master[-3000:]
    assert "Current thread 0x" in master and "(most recent call first)" in master
    second = operator.current(f"{JOB}-master-0").text()
    resumed = re.search(r"resumed from \S+: epoch 0, step (\d+) of \d+ in it, step (\d+) overall", second)
    assert resumed is not None and int(resumed.group(2)) == 6, second[-3000:]
    assert committed(run_dir)[-1] == 16  # 512 samples / (4 ranks x 8)
    capsys.readouterr()
    code = main(
        ["status", "--kubeconfig", str(tmp_path / "kubeconfig"), f"k8s://default/PyTorchJob/{JOB}", "-o", "json"]
    )
    shown = capsys.readouterr()
    assert code == 0, shown.err
    progress = json.loads(shown.out)["progress"]
    assert (progress["step"], progress["state"], progress["attempt"], progress["checkpoint_step"]) == (
        16,
        "finished",
        1,
        16,
    )


def test_elastic_pet_nnodes_is_min_max_after_defaulting(tmp_path: Path) -> None:
    """pytorch_defaults.go setElasticPolicy: min and max are both set before setPodEnv reads them."""
    elastic = manifest(tmp_path, {**spec(tmp_path), "k8s": {"min_nodes": 1, "max_nodes": 3}})
    policy = elastic["spec"]["elasticPolicy"]
    for given, nnodes in (({}, "2:2"), ({"minReplicas": 1}, "1:1"), ({"maxReplicas": 4}, "4:4")):
        elastic["spec"]["elasticPolicy"] = {**{k: v for k, v in policy.items() if "Replicas" not in k}, **given}
        assert dict(operator_env(defaulted(elastic), "Worker", 0))["PET_NNODES"] == nnodes


@needs_pods
@pytest.mark.timeout(400)
def test_a_job_whose_lock_is_taken_over_stops_its_pods_and_fails_without_writing(
    submitted: Any, tmp_path: Path
) -> None:
    """Another job takes the run directory over mid-run (this one looked dead past the stale
    limit: a paused node, a partitioned volume). Pod rank 0's heartbeat kills its program and the
    pod exits 6, which restartPolicy ExitCode does not retry: the job fails, nothing more is
    written into the run directory, and the other job's lock stays."""
    data = mid_run(tmp_path)
    data["env"]["DIST_JOBS_LOCK_HEARTBEAT_SECONDS"] = "0.2"
    job = submitted(data)
    run_dir = tmp_path / "shared" / "ckpt" / JOB
    (tmp_path / "logs").mkdir()
    thief = foreign("k8s:pytorchjob/other/op-harness", "k8s", "pytorchjob/other/op-harness")
    with Operator(job, tmp_path / "logs") as operator:
        first_checkpoint(operator, run_dir)
        take_over(run_dir, thief)
        taken = time.time()
        phase = operator.finish(timeout=300)
    codes = operator.codes()
    master = operator.attempts[0].text()
    assert phase == "Failed" and codes[(f"{JOB}-master-0", 0)] == 6, (codes, master[-3000:])
    assert "this job lost the run directory lock: exit 6" in master, master[-3000:]
    assert Holder.parse((run_dir / "LOCK").read_bytes()) == thief
    late = [p.name for p in run_dir.iterdir() if p.stat().st_mtime > taken + 0.5]
    assert late == [], late  # a write that passed its check just before the takeover aside
