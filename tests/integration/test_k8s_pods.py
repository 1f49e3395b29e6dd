"""PyTorchJobs as Kubernetes runs them: `dist-jobs submit --backend k8s` to the real apiserver,
the tier's controller (the training operator) makes the Pods, two real kubelets (in network
namespaces of their own, so the pods of a job talk across a real network) run them in containerd,
from an image imported without a registry (k8s/kubelet/up.sh).

What the harness tier (test_k8s_operator.py) assumes is exercised here: the container's command
and env after the kubelet's `$(VAR)`/`$$` expansion, /dev/shm from an emptyDir of medium Memory,
the PVC mount, the SIGTERM and grace period of a pod deletion, exit codes as the kubelet reports
them, and logs read through the kubelet. TrainJobs (the tier plays Trainer v2 and its JobSet) and
elastic PyTorchJobs run here too, and the run directory lock on the PVC meets a second job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.cli import main
from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.rundir.node_affinity import kept_off
from support import realpods_tier
from support.lock_support import foreign
from support.paths import REPO, TESTS
from support.specs import POD_TRAIN, paced
from support.tiers import require_module, require_tool, requires
from support.train_support import descendants
from support.waiting import eventually

kubernetes = require_module("kubernetes")
client, config = kubernetes.client, kubernetes.config

pytestmark = [requires("realpods"), pytest.mark.slow]

NS = realpods_tier.NAMESPACE


@pytest.fixture()
def core() -> Iterator[client.CoreV1Api]:
    with config.new_client_from_config(config_file=str(realpods_tier.kubeconfig())) as api:
        yield client.CoreV1Api(api)


@pytest.fixture()
def custom() -> Iterator[client.CustomObjectsApi]:
    with config.new_client_from_config(config_file=str(realpods_tier.kubeconfig())) as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture()
def claim(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh ReadWriteMany claim; the tier binds it to a volume shared by both nodes."""
    name = f"ckpt-{uuid.uuid4().hex[:8]}"
    body = {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    core.create_namespaced_persistent_volume_claim(NS, body)
    yield name
    core.delete_namespaced_persistent_volume_claim(name, NS)


def job_spec(name: str, claim: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "nodes": 2,
        "gpus_per_node": 0,
        "procs_per_node": 2,
        "checkpoint_dir": "ckpt",
        "image": realpods_tier.image(),
        "env": {"DIST_JOBS_RDZV_TIMEOUT": "60", "PYTHONPATH": f"{REPO}:{TESTS}"},
        "train": dict(POD_TRAIN),  # the first test trains the default model, once
        # The claim is mounted where this host sees its volume, so `dist-jobs status` reads the
        # run directory here as on a machine that mounts the same filesystem.
        "k8s": {
            "namespace": NS,
            "pvc": claim,
            "mount_path": str(realpods_tier.volume(claim)),
            "cpu_request": "100m",
            "shm_size": "256Mi",
        },
        **extra,
    }


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*args[:1], "--backend", "k8s", "--kubeconfig", str(realpods_tier.kubeconfig()), *args[1:]])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture()
def submit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> Iterator[Callable[[dict[str, Any]], str]]:
    """`dist-jobs submit --backend k8s`; every job submitted is deleted (with its pods) afterwards."""
    names: list[str] = []

    def run(data: dict[str, Any]) -> str:
        path = tmp_path / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data))
        code, _, err = cli(capsys, "submit", str(path))
        assert code == 0, err
        names.append(data["name"])
        return str(data["name"])

    yield run
    for name in names:
        for api in (("kubeflow.org", "v1", NS, "pytorchjobs"), (*TRAINJOBS[:2], NS, TRAINJOBS[2])):
            try:
                custom.delete_namespaced_custom_object(*api, name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
    left = lambda: any(pods(core, n) or trainjob_pods(core, n) for n in names)
    eventually(lambda: not left(), timeout=120, interval=0.5, what="the deleted jobs' pods to go")


def pods(core: client.CoreV1Api, job: str) -> list[Any]:
    return list(core.list_namespaced_pod(NS, label_selector=f"training.kubeflow.org/job-name={job}").items)


TRAINJOBS = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
INDEX = "batch.kubernetes.io/job-completion-index"


def exited(core: client.CoreV1Api, job: str, timeout: float = 60) -> dict[str, Any]:
    """The job's pods by name once the kubelet reports each one's container terminated. The
    operator judges a job with a Master by the Master alone, so a worker may still be leaving."""

    def check() -> dict[str, Any] | None:
        found = pods(core, job)
        done = all(p.status.container_statuses and p.status.container_statuses[0].state.terminated for p in found)
        return {p.metadata.name: p for p in found} if found and done else None

    return eventually(check, timeout=timeout, interval=0.5, what=f"every pod of {job} to exit")


def trainjob_pods(core: client.CoreV1Api, job: str) -> list[Any]:
    return list(core.list_namespaced_pod(NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={job}").items)


def conditions(custom: client.CustomObjectsApi, job: str, kind: str = "PyTorchJob") -> list[dict[str, Any]]:
    api = ("kubeflow.org", "v1", NS, "pytorchjobs") if kind == "PyTorchJob" else (*TRAINJOBS[:2], NS, TRAINJOBS[2])
    obj = custom.get_namespaced_custom_object(*api, job)
    return list((obj.get("status") or {}).get("conditions") or [])


def ended(custom: client.CustomObjectsApi, job: str, timeout: float, kind: str = "PyTorchJob") -> list[dict[str, Any]]:
    """The job's conditions once it has Succeeded or Failed (a TrainJob: Complete or Failed)."""

    def done(found: list[dict[str, Any]]) -> bool:
        return any(c["type"] in ("Succeeded", "Complete", "Failed") and c["status"] == "True" for c in found)

    # until=: a timeout shows the conditions last seen (Created, Running, Restarting, ...)
    return eventually(
        lambda: conditions(custom, job, kind), until=done, timeout=timeout, interval=0.5, what=f"{kind} {job} to end"
    )


def state(found: list[dict[str, Any]]) -> str:
    return str([c for c in found if c["status"] == "True"][-1]["type"])


def committed(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run_dir.glob("step-*") if (p / "COMPLETE").exists())


def logs(capsys: pytest.CaptureFixture[str], job: str, rank: int) -> str:
    code, out, err = cli(capsys, "logs", f"k8s://{NS}/PyTorchJob/{job}", "--rank", str(rank))
    assert code == 0, err
    return out


@pytest.mark.timeout(300)
def test_two_node_job_trains_checkpoints_on_the_pvc_and_succeeds(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """Slow by nature: its time goes to the real pod lifecycle (the operator creating the pods, the kubelets
    starting containers in containerd, torch importing in each of the four ranks, the cross-node rendezvous) and
    to reading the logs back through the kubelets; the training itself is a few steps."""
    data = job_spec("rp-train", claim)
    del data["train"]["model"]  # the trainer's default, a torchvision model: the image has torchvision
    job = submit(data)
    found = ended(custom, job, 240)
    assert state(found) == "Succeeded", found
    by_name = exited(core, job)
    master, worker = by_name[f"{job}-master-0"], by_name[f"{job}-worker-0"]
    # One pod per node, each with an address of its node's pod network, both exited 0 (kubelet's word).
    assert (master.spec.node_name, worker.spec.node_name) == realpods_tier.NODES
    assert master.status.pod_ip.startswith("10.78.16.") and worker.status.pod_ip.startswith("10.78.32.")
    for pod in (master, worker):
        terminated = pod.status.container_statuses[0].state.terminated
        assert (pod.status.phase, terminated.exit_code) == ("Succeeded", 0), pod.status
    # The worker found the master by the Service name the operator gives it (MASTER_ADDR unchanged).
    line = "dist-jobs: rank {r}/4 node {n}/2 local {l}/2 master %s-master-0:23456 (torchrun, host %s-{p}-0)"
    code, every, err = cli(capsys, "logs", f"k8s://{NS}/PyTorchJob/{job}")  # through the apiserver and the kubelet
    assert code == 0, err
    for node, pod in ((0, "master"), (1, "worker")):
        for local in (0, 1):
            rank = 2 * node + local
            want = (line % (job, job)).format(r=rank, n=node, l=local, p=pod)
            # Each rank's lines, found by the global rank: bare with --rank, `[rank R] ` in the whole log.
            assert want in logs(capsys, job, rank).splitlines(), every[-3000:]
            assert f"[rank {rank}] {want}" in every.splitlines(), every[-3000:]
    run_dir = realpods_tier.volume(claim) / "ckpt" / job
    assert committed(run_dir)[-1] == 4  # 64 samples / (4 ranks x 8) = 2 steps, 2 epochs
    assert sorted(p.name for p in (run_dir / "step-4").glob("rank-*.pt")) == [f"rank-{r}.pt" for r in range(4)]
    code, out, err = cli(capsys, "status", f"k8s://{NS}/PyTorchJob/{job}", "-o", "json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["state"] == "succeeded" and shown["progress"]["state"] == "finished", shown


PROBE = """
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from torchrun
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
shm = [line for line in open("/proc/mounts") if line.split()[1] == "/dev/shm"]
names = ("DJ_DOLLAR", "DJ_REF", "DJ_DOUBLE", "DJ_QUOTES", "DJ_LINES", "MASTER_ADDR")
report = {"rank": dist.get_rank(), "sum": int(total), "argv": sys.argv[1:], "shm": shm,
          "env": {k: os.environ.get(k) for k in names}}
print("PROBE " + json.dumps(report), flush=True)
dist.destroy_process_group()
"""

VALUES = {
    "DJ_DOLLAR": "a$b $HOME",
    "DJ_REF": "$(HOME)/x and $(MASTER_ADDR)",
    "DJ_DOUBLE": "$$ and $$(RANK)",
    "DJ_QUOTES": 'it\'s "quoted" `and` \\back',
    "DJ_LINES": "line one\nline two\n",
}


ARGS = ["$(RANK)", "a$b", "a b", "$$x", "${local_rank}"]


@pytest.mark.timeout(240)
def test_a_users_env_script_gets_its_values_intact_and_a_memory_backed_shm(
    submit: Any, claim: str, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """Slow by nature: real pods on two kubelet nodes, each starting its ranks under torchrun."""
    # The program itself (newlines, quotes) and its args pass the kubelet's expansion and then
    # torchrun's own `${local_rank}` macro (string.Template, which turned `$$` into `$`).
    data = job_spec("rp-env", claim, command=["python3", "-c", PROBE, *ARGS])
    data["env"].update(VALUES)
    data["train"] = {}
    job = submit(data)
    found = ended(custom, job, 180)
    assert state(found) == "Succeeded", found
    # `logs --follow` of an ended job: every pod's log, then the end (no wait).
    code, out, err = cli(capsys, "logs", f"k8s://{NS}/PyTorchJob/{job}", "--follow")
    assert code == 0, err
    found = re.findall(r"^\[rank (\d)\] PROBE (.*)$", out, re.M)
    reports = [json.loads(text) for _, text in found]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert all(int(rank) == r["rank"] for (rank, _), r in zip(found, reports))
    for report in reports:
        assert report["sum"] == 1 + 2 + 3 + 4  # all four ranks, across both nodes
        assert report["argv"] == ARGS
        assert report["env"] == {**VALUES, "MASTER_ADDR": f"{job}-master-0"}
        (line,) = report["shm"]
        assert line.split()[0] == "tmpfs" and line.split()[2] == "tmpfs", line


@pytest.mark.timeout(480)
def test_a_deleted_pod_checkpoints_exits_retryably_and_the_job_resumes(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """Slow by nature: the job runs twice, as real pods: the 64-step run is long enough to be interrupted after
    a committed checkpoint, the deleted pod's ranks stop within its grace period, and the operator deletes and
    recreates the pods, which pull nothing but start containers, torch and the rendezvous again before the
    resumed run finishes."""
    data = paced(job_spec("rp-preempt", claim), steps=64, seconds=0.25)  # a pod deleted mid-run
    job = submit(data)
    run_dir = realpods_tier.volume(claim) / "ckpt" / job
    eventually(lambda: committed(run_dir), timeout=240, interval=0.5, what="a first checkpoint")
    first_master = eventually(
        lambda: [p for p in pods(core, job) if p.metadata.name.endswith("master-0")],
        timeout=5,
        interval=0.5,
        what="master",
    )
    # What a preemption does: the pod is deleted, the kubelet sends SIGTERM and waits the grace period.
    core.delete_namespaced_pod(f"{job}-worker-0", NS)
    found = ended(custom, job, 360)
    assert state(found) == "Succeeded", found
    # Every rank stopped at one step boundary and committed; the master's entrypoint exited 200,
    # which the kubelet reported and restartPolicy ExitCode retried.
    obj = custom.get_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job)
    assert obj["status"]["replicaStatuses"]["Master"] == {"active": 0, "succeeded": 1, "failed": 0}, obj["status"]
    restarting = [c["message"] for c in found if c["type"] == "Restarting"]
    assert restarting and f"exit code {REQUEUE_EXIT_CODE}" in restarting[0], found
    master = [p for p in pods(core, job) if p.metadata.name.endswith("master-0")][0]
    assert master.metadata.uid != first_master[0].metadata.uid  # recreated, not restarted in place
    text = logs(capsys, job, 0)
    resumed = re.search(r"resumed from \S+: epoch 0, step (\d+) of \d+ in it, step (\d+) overall", text)
    assert resumed is not None, text[-3000:]
    assert 0 < int(resumed.group(2)) < 64
    assert committed(run_dir)[-1] == 64
    assert not (run_dir / "LOCK").exists()  # pod rank 0's entrypoint released the run directory


# A user's own DDP script, not the built-in trainer: it keeps its own snapshot in the run
# directory on the claim and resumes from it; it knows nothing of peers lost or exit codes.
SNAPSHOTTING = """
import os, time
from pathlib import Path
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
snap = Path(os.environ["DIST_JOBS_CHECKPOINT_DIR"]) / os.environ["DIST_JOBS_RUN"] / "snapshot.pt"
step = torch.load(snap)["step"] if snap.exists() else 0
print(f"USER starts at step {step}", flush=True)
t = torch.ones(1)
while step < 40:
    dist.all_reduce(t)
    step += 1
    time.sleep(0.3)
    if rank == 0 and step % 4 == 0:
        torch.save({"step": step}, snap.with_suffix(".tmp"))
        os.replace(snap.with_suffix(".tmp"), snap)
print("USER done", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(300)
def test_a_users_script_survives_its_worker_pods_deletion_and_resumes_from_its_own_snapshot(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """The worker pod is deleted mid-run: its entrypoint notes it is leaving before it stops the
    program; the master's ranks then fail on their own (gloo's "Connection reset by peer", exit 1),
    which the verdict reads as a lost peer, not the user's bug: exit 200, and the operator restarts
    the gang, whose script resumes from its own snapshot.
    Slow by nature: the job runs twice as real pods (containers, torch and the rendezvous twice)."""
    data = job_spec("rp-user", claim, command=["python3", "-c", SNAPSHOTTING])
    data["train"] = {}
    job = submit(data)
    run_dir = realpods_tier.volume(claim) / "ckpt" / job
    eventually(lambda: (run_dir / "snapshot.pt").exists(), timeout=240, interval=0.5, what="the script's snapshot")
    core.delete_namespaced_pod(f"{job}-worker-0", NS)
    found = ended(custom, job, 240)
    assert state(found) == "Succeeded", found
    assert (run_dir / "peers" / f"{job}-worker-0").is_file()  # the deleted pod said it was leaving
    decisions = (realpods_tier.state_dir() / "controller.log").read_text()
    assert f"PyTorchJob {job} is restarting because 1 Master replica(s) failed (exit code 200)." in decisions
    text = logs(capsys, job, 0)
    starts = [int(n) for n in re.findall(r"USER starts at step (\d+)", text)]
    assert starts and starts[-1] > 0 and "USER done" in text, text[-3000:]  # the recreated pod resumed
    ends = [json.loads(line) for f in (run_dir / "verdicts").iterdir() for line in f.read_text().splitlines()]
    assert any(v["ending"] == "peer lost" and f"{job}-worker-0" in v["cause"] for v in ends), ends


def container_pid(pod: Any) -> int:
    """The host pid of the pod's container (its PID 1: the entrypoint), from its node's containerd."""
    cid = pod.status.container_statuses[0].container_id.split("://")[1]
    node = realpods_tier.NODES.index(pod.spec.node_name) + 1
    sock = realpods_tier.state_dir() / f"node{node}" / "ctd" / "containerd.sock"
    ctr = require_tool("ctr")
    tasks = subprocess.run([ctr, "-a", str(sock), "-n", "k8s.io", "tasks", "ls"], capture_output=True, text=True)
    (pid,) = [line.split()[1] for line in tasks.stdout.splitlines() if line.startswith(cid)]
    return int(pid)


def script_rank(pod: Any) -> int:
    """The host pid of one of the pod's ranks of the user's script (`python3 -c SCRIPT` under torchrun)."""
    argvs = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in descendants(container_pid(pod))}
    # not the entrypoint's sh nor torchrun, whose arguments carry the script too
    ranks = [pid for pid, argv in argvs.items() if b"python" in argv[0] and argv[1:2] == [b"-c"]]
    assert len(ranks) == 2, argvs
    return ranks[-1]


@pytest.mark.timeout(300)
def test_a_rank_of_a_users_script_killed_on_a_node_keeps_the_jobs_recreated_pods_off_that_node(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """Never the same bad node twice, as Kubernetes runs it, for a user's own script under torchrun
    (the default launch): with `max_restarts: 0` a rank of the worker pod SIGKILLed by nobody
    dist-jobs knows is its node's fault. torchrun (dist_jobs.train.torchrun) exits 137 as that rank
    did, not 1; before the worker pod exits 200 it leaves its peers a note, quarantines its node
    and, through its ServiceAccount's Role and the in-cluster apiserver, patches the PyTorchJob so
    that every template refuses that node. The master's ranks die of the lost peer with the
    script's own exit code (1), which the note makes a lost peer: exit 200, not the job's failure.
    The operator recreates the pods from the patched templates, the tier's scheduler places the
    worker on the other node, the script resumes from its own snapshot and the job succeeds; status
    named the node kept away while it ran.
    Slow by nature: the job runs twice (the first snapshot, the kill, new pods, the rest)."""
    data = job_spec("rp-away", claim, command=["python3", "-c", SNAPSHOTTING])
    data["train"] = {}
    data["preemption"] = {"max_restarts": 0}
    job = submit(data)
    run_dir = realpods_tier.volume(claim) / "ckpt" / job
    eventually(lambda: (run_dir / "snapshot.pt").exists(), timeout=240, interval=0.5, what="the script's snapshot")
    (worker,) = [p for p in pods(core, job) if p.metadata.name.endswith("worker-0")]
    node = worker.spec.node_name
    victim = script_rank(worker)
    rank = int(dict(v.split(b"=", 1) for v in Path(f"/proc/{victim}/environ").read_bytes().split(b"\0") if v)[b"RANK"])
    os.kill(victim, signal.SIGKILL)
    templates = lambda: custom.get_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job)["spec"][
        "pytorchReplicaSpecs"
    ]
    refused = lambda: [kept_off(r["template"]["spec"]) for r in templates().values()]
    eventually(lambda: refused() == [[node], [node]], timeout=120, interval=0.5, what=f"the job to refuse {node}")
    code, out, err = cli(capsys, "status", f"k8s://{NS}/PyTorchJob/{job}", "-o", "json")
    assert code == 0, err
    kept = f"{node} (rank {rank} killed by SIGKILL (exit 137) on {job}-worker-0; until "  # torchrun noted it
    assert json.loads(out)["extra"].get("kept_away", "").startswith(kept), out
    found = ended(custom, job, 360)
    assert state(found) == "Succeeded", found
    (again,) = [p for p in pods(core, job) if p.metadata.name.endswith("worker-0")]
    assert again.metadata.uid != worker.metadata.uid and again.spec.node_name != node
    text = logs(capsys, job, 0)
    starts = [int(n) for n in re.findall(r"USER starts at step (\d+)", text)]
    assert starts and starts[-1] > 0 and "USER done" in text, text[-3000:]  # resumed from its snapshot
    ends = [json.loads(line) for f in (run_dir / "verdicts").iterdir() for line in f.read_text().splitlines()]
    faults = sorted((v["ending"], v["node"] if v["ending"] == "rank killed" else v["cause"]) for v in ends)
    assert [f for f in faults if f[0] != "completed"] == [
        ("peer lost", f"{job}-worker-0 stopped while the program ran"),  # the master: not the script's bug
        ("rank killed", node),
    ], ends
    assert [v["rank"] for v in ends if v["ending"] == "rank killed"] == [rank]  # as the worker's torchrun noted it
    said = (realpods_tier.state_dir() / "pod-logs" / f"{job}-worker-0.{worker.metadata.uid}.log").read_text()
    assert "dist-jobs: torchrun: rank " in said and "failed first (killed by SIGKILL): exit 137" in said, said[-3000:]
    assert f"dist-jobs: the job's pods keep away from {node} (rank {rank} killed by SIGKILL" in said, said[-3000:]


@pytest.mark.timeout(480)
def test_a_pod_killed_without_warning_is_recreated_and_the_gang_resumes(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """SIGKILL to the master container's PID 1 (an OOM kill, a node loss): the kubelet reports 137,
    retryable under ExitCode; the worker loses its peer and exits 200; both are recreated and resume.
    Slow by nature: the job runs twice: after the SIGKILL the worker only exits once its ranks notice the
    lost peer, then the operator recreates both pods, which start containerd tasks, torch and the rendezvous
    again and finish the 64-step run from the checkpoint."""
    data = paced(job_spec("rp-kill", claim), steps=64, seconds=0.25)
    job = submit(data)
    run_dir = realpods_tier.volume(claim) / "ckpt" / job
    eventually(lambda: committed(run_dir), timeout=240, interval=0.5, what="a first checkpoint")
    (master,) = [p for p in pods(core, job) if p.metadata.name.endswith("master-0")]
    os.kill(container_pid(master), signal.SIGKILL)
    found = ended(custom, job, 360)
    assert state(found) == "Succeeded", found
    # The job keeps one Restarting condition (the latest); the operator's log has every decision.
    decisions = (realpods_tier.state_dir() / "controller.log").read_text()
    assert f"PyTorchJob {job} is restarting because 1 Master replica(s) failed (exit code 137)." in decisions
    assert f"PyTorchJob {job} is restarting because 1 Worker replica(s) failed (exit code 200)." in decisions
    text = logs(capsys, job, 0)
    resumed = re.search(r"resumed from \S+: epoch 0, step (\d+) of \d+ in it, step (\d+) overall", text)
    assert resumed is not None and 0 < int(resumed.group(2)) < 64, text[-3000:]
    assert committed(run_dir)[-1] == 64


@pytest.mark.timeout(180)
def test_status_and_cancel_of_a_running_job(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    data = job_spec(
        "rp-cancel", claim, command=["python3", "-c", "import time; print('up', flush=True); time.sleep(600)"]
    )
    data["train"] = {}
    job = submit(data)
    handle = f"k8s://{NS}/PyTorchJob/{job}"

    def running() -> bool:
        found = pods(core, job)
        return (
            len(found) == 2
            and all(p.status.phase == "Running" for p in found)
            and state(conditions(custom, job)) == "Running"
        )

    eventually(running, timeout=120, interval=0.5, what="both pods to run")
    code, out, err = cli(capsys, "status", handle, "-o", "json")
    assert code == 0 and json.loads(out)["state"] == "running", out + err
    eventually(lambda: "up" in logs(capsys, job, 1).split(), timeout=60, interval=0.5, what="the worker's first line")
    code, _, err = cli(capsys, "cancel", handle)
    assert code == 0, err
    eventually(lambda: not pods(core, job), timeout=90, interval=0.5, what="the cancelled job's pods to go")

    def gone() -> bool:
        try:
            custom.get_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    eventually(gone, timeout=30, interval=0.5, what="the cancelled job to be deleted")
    code, _, err = cli(capsys, "status", handle)
    assert code != 0 and job in err, err


@pytest.mark.timeout(240)
def test_a_snapshot_job_runs_the_code_as_submitted_on_every_pod(
    submit: Any,
    claim: str,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    capsys: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The code is not in the image: submit --snapshot sends this folder as it is now, in a
    # ConfigMap the job owns; editing it after submit changes nothing the pods run.
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "version.py").write_text("VERSION = 'submitted'\n")
    (code / "train.py").write_text(
        "import os\nfrom pkg.version import VERSION\n"
        "print('SNAP', VERSION, os.getcwd(), 'rank', os.environ['RANK'], flush=True)\n"
    )
    monkeypatch.chdir(code)  # the snapshot is of the folder submit runs in
    data = job_spec("rp-snap", claim, command=["python3", "train.py"], snapshot=True)
    data["train"] = {}
    job = submit(data)
    try:
        (code / "pkg" / "version.py").write_text("VERSION = 'edited'\n")
        found = ended(custom, job, 180)
        assert state(found) == "Succeeded", found
        seen = []
        for rank in range(4):  # 2 pods x 2 processes; --rank is the global rank
            text = logs(capsys, job, rank)
            assert "edited" not in text, text[-3000:]
            seen += re.findall(r"^SNAP submitted /dist-jobs/code rank (\d)$", text, re.M)
        assert sorted(seen) == ["0", "1", "2", "3"]  # every process of both pods ran the submitted code
        configmap = core.read_namespaced_config_map(f"{job}-code", NS)
        owner = configmap.metadata.owner_references[0]
        uid = custom.get_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", job)["metadata"]["uid"]
        assert (owner.kind, owner.name, owner.uid) == ("PyTorchJob", job, uid)
    finally:
        try:  # the garbage collector removes it with the job where one runs; this tier may have none
            core.delete_namespaced_config_map(f"{job}-code", NS)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def _trained_on_both_nodes(job_pods: list[Any], run_dir: Path, every: str) -> None:
    """One pod per node, each exited 0; the 4 ranks' lines in the logs; the run completed on the PVC."""
    assert sorted(p.spec.node_name for p in job_pods) == sorted(realpods_tier.NODES)
    for pod in job_pods:
        terminated = pod.status.container_statuses[0].state.terminated
        assert (pod.status.phase, terminated.exit_code) == ("Succeeded", 0), pod.status
    for rank in range(4):
        assert re.search(rf"^\[rank {rank}\] dist-jobs: rank {rank}/4 ", every, re.M), every[-3000:]
    assert committed(run_dir)[-1] == 4  # 64 samples / (4 ranks x 8) = 2 steps, 2 epochs
    assert not (run_dir / "LOCK").exists()


@pytest.mark.timeout(240)
def test_a_two_node_trainjob_trains_and_completes(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """Trainer v2: the pods the JobSet's Indexed Job makes, with the torch plugin's PET_* only
    (PET_NODE_RANK from the completion index, the master by its JobSet DNS name).
    Slow by nature: real pods on two kubelet nodes start torch and train to the end."""
    data = job_spec("rp-tj", claim)
    data["k8s"]["api"] = "trainjob"
    job = submit(data)
    found = ended(custom, job, 200, kind="TrainJob")
    assert state(found) == "Complete", found
    job_pods = trainjob_pods(core, job)
    assert sorted(p.metadata.annotations[INDEX] for p in job_pods) == ["0", "1"]
    code, every, err = cli(capsys, "logs", f"k8s://{NS}/TrainJob/{job}")
    assert code == 0, err
    _trained_on_both_nodes(job_pods, realpods_tier.volume(claim) / "ckpt" / job, every)
    code, out, err = cli(capsys, "status", f"k8s://{NS}/TrainJob/{job}", "-o", "json")
    assert code == 0 and json.loads(out)["state"] == "succeeded", out + err


@pytest.mark.timeout(240)
def test_an_elastic_pytorchjob_trains_and_succeeds(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """elasticPolicy: Workers only, torchrun's c10d rendezvous at worker 0 (PET_RDZV_ENDPOINT,
    PET_NNODES=min:max as the operator sets them); rank 0 of the trainer holds the lock.
    Slow by nature: real pods on two kubelet nodes meet in torchrun's rendezvous and train to the end."""
    data = job_spec("rp-elastic", claim)
    data["k8s"].update(min_nodes=1, max_nodes=2)
    job = submit(data)
    found = ended(custom, job, 200)
    assert state(found) == "Succeeded", found
    job_pods = pods(core, job)
    assert sorted(p.metadata.name for p in job_pods) == [f"{job}-worker-0", f"{job}-worker-1"]
    env = {e.name: e.value for e in job_pods[0].spec.containers[0].env}
    assert (env["PET_RDZV_ENDPOINT"], env["PET_NNODES"]) == (f"{job}-worker-0:23456", "1:2")
    code, every, err = cli(capsys, "logs", f"k8s://{NS}/PyTorchJob/{job}")
    assert code == 0, err
    _trained_on_both_nodes(job_pods, realpods_tier.volume(claim) / "ckpt" / job, every)


@pytest.mark.timeout(480)
def test_the_run_directory_lock_on_the_pvc_refuses_a_second_job_and_survives_a_killed_holder(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi, capsys: Any
) -> None:
    """A TrainJob holds `ckpt/rp-lock` on the PVC; a PyTorchJob of the same name (so the same run
    directory, another owner) is refused while the holder's heartbeat beats: its pod rank 0
    exits 2, which ExitCode does not retry, and `status` and `logs` say why. Then the holder's
    node-0 container is SIGKILLed: the kubelet restarts it (OnFailure), the restarted entrypoint
    takes its own job's lock over at once and the run resumes from its checkpoint.
    Slow by nature: three pod lifecycles run one after another on the two kubelets (the holder's 128-step
    training, the refused job's pods, the holder's restarted container), each starting torch in every rank; the
    holder must train long enough to outlast the refusal and still be mid-run when it is killed, so that the
    resume from its checkpoint is seen."""
    # 128 steps of half a second: the refusal is over, and the holder still mid-run, when it is killed
    data = paced(job_spec("rp-lock", claim), steps=128, seconds=0.5)
    data["env"].update({"DIST_JOBS_LOCK_STALE_SECONDS": "10", "DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "1"})
    holder = submit({**data, "k8s": {**data["k8s"], "api": "trainjob"}})
    run_dir = realpods_tier.volume(claim) / "ckpt" / holder
    eventually(lambda: committed(run_dir), timeout=240, interval=0.5, what="the holder's first checkpoint")
    assert b"k8s:trainjob/" in (run_dir / "LOCK").read_bytes()

    second = submit(data)  # k8s.api: pytorchjob, the same name
    handle = f"k8s://{NS}/PyTorchJob/{second}"
    found = ended(custom, second, 120)
    assert state(found) == "Failed" and "exit code 2" in found[-1]["message"], found
    code, out, err = cli(capsys, "status", handle, "-o", "json")
    assert code == 0 and json.loads(out)["state"] == "failed", out + err
    assert "rank 0 failed first: exit 2" in json.loads(out)["detail"], out
    code, out, err = cli(capsys, "logs", handle)
    assert code == 0 and "is in use by another run" in out, out + err
    assert b"k8s:trainjob/" in (run_dir / "LOCK").read_bytes()  # the holder's lock untouched

    first = committed(run_dir)[-1]
    (node0,) = [p for p in trainjob_pods(core, holder) if p.metadata.annotations[INDEX] == "0"]
    os.kill(container_pid(node0), signal.SIGKILL)
    found = ended(custom, holder, 360, kind="TrainJob")
    assert state(found) == "Complete", found
    (node0,) = [p for p in trainjob_pods(core, holder) if p.metadata.annotations[INDEX] == "0"]
    assert node0.status.container_statuses[0].restart_count >= 1  # restarted in place, not recreated
    code, text, err = cli(capsys, "logs", f"k8s://{NS}/TrainJob/{holder}", "--rank", "0")
    resumed = re.search(r"resumed from \S+: epoch 0, step (\d+) of \d+ in it, step (\d+) overall", text)
    assert resumed is not None and first <= int(resumed.group(2)) < 128, text[-3000:] + err
    assert committed(run_dir)[-1] == 128
    assert not (run_dir / "LOCK").exists()


# A user's program on every pod: a line a tenth of a second into a file of its own in the run directory.
WRITING = """
import os, pathlib, time
run_dir = pathlib.Path(os.environ["DIST_JOBS_CHECKPOINT_DIR"]) / os.environ["DIST_JOBS_RUN"]
mine = run_dir / ("writes-" + os.environ.get("PET_NODE_RANK", "x"))
for i in range(1200):
    with open(mine, "a") as fh:
        fh.write(f"{i}\\n")
    time.sleep(0.1)
"""


def test_every_pods_program_stops_once_another_job_takes_the_run_directory_over(
    submit: Any, claim: str, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    """Pod 0 holds the lock, the worker pod follows it. Another job takes the run directory over
    (its record renamed over LOCK, as a takeover past the stale limit does): within a beat or two
    both pods' programs are SIGKILLed and exit 6, which ExitCode does not retry, and neither
    writes into the run directory after that."""
    data = job_spec("rp-follow", claim, command=["python3", "-c", WRITING])
    data["train"] = {}
    data["env"].update({"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "1"})
    job = submit(data)
    run_dir = realpods_tier.volume(claim) / "ckpt" / job
    files = [run_dir / "writes-0", run_dir / "writes-1"]

    def lines() -> list[int]:
        return [len(f.read_text().splitlines()) if f.exists() else 0 for f in files]

    eventually(lambda: min(lines()) >= 10, timeout=240, interval=0.5, what="both pods writing")
    assert f"k8s:pytorchjob/{NS}/{job}".encode() in (run_dir / "LOCK").read_bytes()
    thief = foreign(f"k8s:pytorchjob/other/{job}", "k8s", f"pytorchjob/other/{job}")
    (run_dir / "LOCK.new").write_bytes(thief.to_bytes())
    os.rename(run_dir / "LOCK.new", run_dir / "LOCK")
    at_takeover = lines()
    found = ended(custom, job, 120)
    assert state(found) == "Failed", found
    codes = {n: p.status.container_statuses[0].state.terminated.exit_code for n, p in exited(core, job).items()}
    assert set(codes.values()) == {6}, codes  # lock lost, on the worker too: not retried
    after = lines()
    # a heartbeat (1 s) and the kill: about ten lines each at most, never the rest of the 1200
    assert all(a - b <= 30 for a, b in zip(after, at_takeover)), (at_takeover, after)
    assert (run_dir / "LOCK").read_bytes() == thief.to_bytes()  # the other job's lock stays
