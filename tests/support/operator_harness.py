"""Plays the Kubeflow training operator (v1.9) for a submitted PyTorchJob, with real processes.

Each replica pod becomes a local process in its own network namespace: its own IP on a bridge,
its own hostname, and an /etc/hosts that resolves every pod's name, as the operator's per-pod
headless Services do (`ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts). The process
is the container's command, started with exactly the environment the operator's setPodEnv
builds (`../shared/k8s/KUBERNETES_NOTES.md`, section 1): the container's own env first, then
PYTHONUNBUFFERED, MASTER_*/PET_MASTER_*, WORLD_SIZE, RANK (the pod index), PET_NODE_RANK,
PET_NPROC_PER_NODE and PET_NNODES, or the elastic PET_RDZV_* set, all through the kubelet's
`$(VAR)`/`$$` expansion (support.kubelet). Only PATH, HOME, HOSTNAME and the image's PYTHONPATH
come from elsewhere (the image and the kubelet).

The controller's decisions follow the operator's source (kubeflow/trainer v1.9.4,
pkg/controller.v1/pytorch and pkg/controller.v1/common, KUBERNETES_NOTES section 5):
* ExitCode: a pod exiting 128-255 (or killed by a signal) is recreated, 1-127 fails the job;
  OnFailure: the container restarts in place; Never: the job fails.
* runPolicy.backoffLimit caps nothing under ExitCode (the work queue's retry count is always 0,
  kubeflow/trainer#2045), except 0, which fails the job on the first pod failure of any kind;
  under OnFailure it caps in-place container restarts.
* The job succeeds when its Master succeeds (without a Master: when every Worker has).
* cleanPodPolicy None (what dist-jobs renders): when the job ends, no pod is deleted, so
  surviving pods keep running; a pod that exits after the end is not restarted.

Needs root, `ip` and `unshare`; `available()` says why not.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import kubelet
from support.waiting import eventually

DEFAULT_PORT = 23456  # the operator's default for the port named pytorchjob-port
BRIDGE = "djopbr0"
SUBNET = "10.79.0"
NS_PREFIX = "djop-"
RETRYABLE_FROM = 128  # training-operator IsRetryableExitCode: exitCode >= 128


def available() -> str | None:
    """None when pods can run here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


# -- what the operator computes ------------------------------------------------------------


def defaulted(job: dict[str, Any]) -> dict[str, Any]:
    """SetDefaults_PyTorchJob, as the controller applies it in memory."""
    job = copy.deepcopy(job)
    spec = job["spec"]
    if "nProcPerNode" not in (spec.get("elasticPolicy") or {}):
        spec.setdefault("nprocPerNode", "auto")
    run_policy = spec.setdefault("runPolicy", {})
    run_policy.setdefault("cleanPodPolicy", "None")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:  # setElasticPolicy: min and max both set, from each other or the Workers
        workers = spec["pytorchReplicaSpecs"].get("Worker", {}).get("replicas", 1)
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        elastic["minReplicas"] = low if low is not None else high if high is not None else workers
        elastic["maxReplicas"] = high if high is not None else elastic["minReplicas"]
    for replica in spec["pytorchReplicaSpecs"].values():
        replica.setdefault("replicas", 1)
        replica.setdefault("restartPolicy", "OnFailure")
        for container in replica["template"]["spec"]["containers"]:
            ports = container.setdefault("ports", [])
            if container["name"] == "pytorch" and not any(p.get("name") == "pytorchjob-port" for p in ports):
                ports.append({"name": "pytorchjob-port", "containerPort": DEFAULT_PORT})
    return job


def _port(replica: dict[str, Any]) -> int:
    for container in replica["template"]["spec"]["containers"]:
        if container["name"] == "pytorch":
            for port in container.get("ports", []):
                if port.get("name") == "pytorchjob-port":
                    return int(port["containerPort"])
    return DEFAULT_PORT


def _nproc_int(value: Any) -> int:
    text = str(value)
    return int(text) if text.isdigit() else 1


def operator_env(job: dict[str, Any], rtype: str, index: int) -> list[tuple[str, str]]:
    """setPodEnv's additions for pod `index` of replica type `rtype` of a defaulted job, in order."""
    spec, name = job["spec"], job["metadata"]["name"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(int(r["replicas"]) for r in replicas.values())
    env = [("PYTHONUNBUFFERED", "1")]
    if "Master" in replicas:
        port = str(_port(replicas["Master"]))
        master = f"{name}-master-0"
        rank = "0" if rtype == "Master" else str(index + 1)
        env += [
            ("MASTER_PORT", port),
            ("PET_MASTER_PORT", port),
            ("MASTER_ADDR", master),
            ("PET_MASTER_ADDR", master),
            ("WORLD_SIZE", str(total * _nproc_int(spec.get("nprocPerNode", "auto")))),
            ("RANK", rank),
            ("PET_NODE_RANK", rank),
        ]
    if "nprocPerNode" in spec:
        env.append(("PET_NPROC_PER_NODE", str(spec["nprocPerNode"])))
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        env.append(("PET_NNODES", str(total)))
    else:
        env += _elastic_env(name, replicas, elastic)
    return env


def _elastic_env(name: str, replicas: dict[str, Any], elastic: dict[str, Any]) -> list[tuple[str, str]]:
    workers = replicas["Worker"]
    host = elastic.get("rdzvHost") or f"{name}-worker-0"
    port = elastic.get("rdzvPort") or _port(workers)
    env = [
        ("PET_RDZV_ENDPOINT", f"{host}:{port}"),
        ("PET_RDZV_BACKEND", elastic.get("rdzvBackend") or "c10d"),
        ("PET_NNODES", f"{elastic['minReplicas']}:{elastic['maxReplicas']}"),  # always min:max once defaulted
    ]
    if "maxRestarts" in elastic:
        env.append(("PET_MAX_RESTARTS", str(elastic["maxRestarts"])))
    if "nProcPerNode" in elastic:
        env.append(("PET_NPROC_PER_NODE", str(elastic["nProcPerNode"])))
    if "rdzvId" in elastic:
        env.append(("PET_RDZV_ID", str(elastic["rdzvId"])))
    if elastic.get("rdzvConf"):
        conf = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
        env.append(("PET_RDZV_CONF", conf))
    if elastic.get("standalone"):
        env.append(("PET_STANDALONE", ""))
    return env


@dataclass(frozen=True)
class Pod:
    name: str
    rtype: str
    index: int
    command: list[str]
    env: dict[str, str]
    restart_policy: str
    workdir: str | None


def _metadata(job: dict[str, Any], replica: dict[str, Any], rtype: str, index: int) -> dict[str, Any]:
    """The pod's metadata: the template's, plus the labels the operator adds (common/pod.go)."""
    template = replica["template"].get("metadata") or {}
    name = job["metadata"]["name"]
    labels = {
        **(template.get("labels") or {}),
        "training.kubeflow.org/job-name": name,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": rtype.lower(),
        "training.kubeflow.org/replica-index": str(index),
    }
    return {
        "name": f"{name}-{rtype.lower()}-{index}",
        "namespace": job["metadata"].get("namespace", "default"),
        "labels": labels,
        "annotations": dict(template.get("annotations") or {}),
    }


def pods(job: dict[str, Any]) -> list[Pod]:
    """The replica pods the operator would create, Master first, as the kubelet starts them."""
    job = defaulted(job)
    result = []
    for rtype in sorted(job["spec"]["pytorchReplicaSpecs"], key=lambda r: r != "Master"):
        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        container = next(c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch")
        for index in range(int(replica["replicas"])):
            pod = {"metadata": _metadata(job, replica, rtype, index)}
            # setPodEnv appends after the container's own env: the operator's value wins a duplicate
            added = [{"name": k, "value": v} for k, v in operator_env(job, rtype, index)]
            env = kubelet.environment([*container.get("env", []), *added], pod)
            result.append(
                Pod(
                    pod["metadata"]["name"],
                    rtype,
                    index,
                    kubelet.argv(container, env),
                    env,
                    replica["restartPolicy"],
                    container.get("workingDir"),
                )
            )
    return result


def retries(policy: str, code: int) -> bool:
    """Whether the operator restarts a pod whose container exited with `code`."""
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return code != 0
    if policy == "ExitCode":
        return code >= RETRYABLE_FROM
    return False


# -- the pods' network -----------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class PodNetwork:
    """One network namespace per pod on a bridge, with /etc/hosts naming every pod."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.address = {n: f"{SUBNET}.{10 + i}" for i, n in enumerate(names)}

    def namespace(self, pod: str) -> str:
        return f"{NS_PREFIX}{self.names.index(pod)}"

    def __enter__(self) -> PodNetwork:
        self.teardown()  # a run killed before its cleanup left these behind
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("link", "set", BRIDGE, "up")
        hosts = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
            f"{addr} {pod}\n" for pod, addr in self.address.items()
        )
        for i, pod in enumerate(self.names):
            ns, veth = self.namespace(pod), f"{NS_PREFIX}v{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", BRIDGE, "up")
            _ip("-n", ns, "addr", "add", f"{self.address[pod]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", "eth0", "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.teardown()

    def teardown(self) -> None:
        for ns in Path("/run/netns").glob(f"{NS_PREFIX}*") if Path("/run/netns").exists() else []:
            pids = subprocess.run(["ip", "netns", "pids", ns.name], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns.name, check=False)
            shutil.rmtree(Path("/etc/netns") / ns.name, ignore_errors=True)
        _ip("link", "del", BRIDGE, check=False)
        # A pod process that outlived its netns name keeps the namespace, and so the host end of
        # its veth pair: remove those too, or the next run cannot create them.
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if name.startswith(f"{NS_PREFIX}v"):
                _ip("link", "del", name, check=False)

    def kill_all(self, pod: str) -> None:
        pids = subprocess.run(["ip", "netns", "pids", self.namespace(pod)], capture_output=True, text=True)
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def argv(self, pod: str, command: list[str]) -> list[str]:
        # The pod's hostname is its name, as the kubelet sets it; gloo binds to what it resolves to.
        return [
            "ip",
            "netns",
            "exec",
            self.namespace(pod),
            "unshare",
            "--uts",
            "--",
            "/bin/sh",
            "-c",
            'hostname "$0" && exec "$@"',
            pod,
            *command,
        ]


# -- the controller loop ---------------------------------------------------------------------


@dataclass
class Attempt:
    pod: str
    number: int
    log: Path
    process: subprocess.Popen[bytes]
    code: int | None = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Operator:
    """Runs the job's pods until the job ends, restarting them as the operator would."""

    job: dict[str, Any]
    logs: Path
    path: str = os.path.dirname(sys.executable) + os.pathsep + "/usr/sbin:/usr/bin:/sbin:/bin"
    attempts: list[Attempt] = field(default_factory=list)
    phase: dict[str, str] = field(default_factory=dict)
    condition: str = "Running"  # the job's: Running, then Succeeded or Failed

    def __post_init__(self) -> None:
        self.pods = {pod.name: pod for pod in pods(self.job)}
        self.backoff_limit = self.job["spec"].get("runPolicy", {}).get("backoffLimit")
        self.network = PodNetwork(list(self.pods))

    def __enter__(self) -> Operator:
        self.network.__enter__()
        for name in self.pods:
            self._start(name)
        return self

    def __exit__(self, *_exc: object) -> None:
        for attempt in self.running():
            os.killpg(attempt.process.pid, signal.SIGKILL)
            attempt.process.wait()
        self.network.__exit__()

    def _start(self, name: str) -> None:
        pod = self.pods[name]
        number = sum(1 for a in self.attempts if a.pod == name)
        log = self.logs / f"{name}.{number}.log"
        # The image's python path (the checkout under test) under the container's own env, which
        # overrides the image's as the kubelet does: a spec's PYTHONPATH wins over the caller's.
        image = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        env = {**image, **pod.env, "PATH": self.path, "HOME": str(self.logs), "HOSTNAME": name}
        with log.open("wb") as out:
            process = subprocess.Popen(
                self.network.argv(name, pod.command),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=pod.workdir or self.logs,
                start_new_session=True,
            )
        self.attempts.append(Attempt(name, number, log, process))
        self.phase[name] = "Running"

    def running(self) -> list[Attempt]:
        return [a for a in self.attempts if a.code is None]

    def current(self, pod: str) -> Attempt:
        return [a for a in self.attempts if a.pod == pod][-1]

    def evict(self, pod: str) -> None:
        """What a node drain or preemption does: SIGTERM to the container's PID 1."""
        os.kill(self.current(pod).process.pid, signal.SIGTERM)

    def kill(self, pod: str) -> None:
        """What a node loss (or a container-wide OOM kill) does: every process of the pod dies at
        once, without warning, torchrun's workers too, which run in sessions of their own."""
        self.network.kill_all(pod)

    def restarts(self) -> int:
        return len(self.attempts) - len(self.pods)

    def poll(self) -> None:
        """One reconcile: collect the pods that exited and act on them."""
        for attempt in self.running():
            code = attempt.process.poll()
            if code is not None:  # a container killed by signal N exits 128 + N
                self._finished(attempt, 128 - code if code < 0 else code)

    def run(self, timeout: float) -> str:
        """Reconcile until the job ends: 'Succeeded' or 'Failed' (pods may still run); fail on timeout."""

        def ended() -> bool:
            if self.condition == "Running":
                self.poll()
            return self.condition != "Running"

        eventually(
            ended,
            timeout=timeout,
            interval=0.1,
            what="the job's end",
            context=lambda: f"pods still running: {[a.pod for a in self.running()]}",
        )
        return self.condition

    def finish(self, timeout: float) -> str:
        """run() until the job ends, then settle() for up to a minute: the job's phase."""
        phase = self.run(timeout)
        self.settle(timeout=60)  # a Worker may end just after the Master
        return phase

    def codes(self) -> dict[tuple[str, int], int | None]:
        """Each pod attempt's exit code, by (pod, attempt number); None while it runs."""
        return {(a.pod, a.number): a.code for a in self.attempts}

    def settle(self, timeout: float) -> None:
        """After the job ended: wait for the pods still running to exit by themselves, recording
        their codes. The job succeeds when its Master does, and under cleanPodPolicy None a Worker
        that is still writing its last lines keeps running; on a loaded machine it can end a few
        seconds after the Master. One that does not end in `timeout` keeps code None."""

        def all_exited() -> bool:
            self.poll()
            return not self.running()

        eventually(all_exited, timeout=timeout, interval=0.1, what="the pods' own exit", default=False)

    def _finished(self, attempt: Attempt, code: int) -> None:
        attempt.code = code
        pod = self.pods[attempt.pod]
        self.phase[pod.name] = "Succeeded" if code == 0 else "Failed"
        if self.condition != "Running":
            return  # the job has ended: nothing is restarted, nothing is cleaned up (cleanPodPolicy None)
        if code == 0:
            self._maybe_succeeded()
        elif self.backoff_limit == 0:
            self.condition = "Failed"  # the fake work queue's retry count 0 + 1 > 0: any failure ends the job
        elif pod.restart_policy == "OnFailure" and self._container_restarts(pod.name) < (self.backoff_limit or 1 << 30):
            self._start(pod.name)  # an in-place container restart: the only kind backoffLimit counts
        elif pod.restart_policy == "ExitCode" and retries("ExitCode", code):
            self._start(pod.name)  # deleted and recreated: no limit
        else:
            self.condition = "Failed"

    def _container_restarts(self, pod: str) -> int:
        return sum(1 for a in self.attempts if a.pod == pod) - 1

    def _maybe_succeeded(self) -> None:
        if "Master" in {p.rtype for p in self.pods.values()}:
            done = all(self.phase[p.name] == "Succeeded" for p in self.pods.values() if p.rtype == "Master")
        else:
            done = all(phase == "Succeeded" for phase in self.phase.values())
        if done:
            self.condition = "Succeeded"
