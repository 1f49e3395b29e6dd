"""The `realpods` tier's controller: the Kubeflow training operator (v1.9, PyTorchJob) for one
namespace, plus the control-plane loops this apiserver lacks (no kube-controller-manager, no
scheduler, no cluster DNS).

As the operator (the decisions come from tests/support/operator_harness.py, which encodes
kubeflow/trainer v1.9.4; KUBERNETES_NOTES section 5):
* one Pod per replica, named <job>-<type>-<index>, with the operator's labels, an ownerReference
  to the job, the operator's env appended to the `pytorch` container (MASTER_ADDR=<job>-master-0,
  PET_*, WORLD_SIZE, RANK) and restartPolicy ExitCode turned into the pod's Never;
* a headless Service per pod, of the same name;
* ExitCode: a pod whose container exited 128-255 is deleted and recreated, 1-127 fails the job;
  backoffLimit 0 fails the job on the first failure; the job succeeds when its Master has;
  cleanPodPolicy None: nothing is deleted when the job ends.
* job status: the operator's conditions (Created, Running, Restarting, Succeeded, Failed) and
  replicaStatuses.

In place of the missing control plane:
* scheduler: spec.nodeName among the nodes the pod's template allows (nodeSelector, required node
  affinity); without constraints the Master on the first node and the Workers alternating. A pod
  that fits no node is not created (a scheduler would leave it Pending): the job waits;
* endpoints controller + cluster DNS: the Endpoints of each pod's Service, and `hostAliases`
  naming the other pods of the job by those endpoints (so MASTER_ADDR stays the Service name, and
  a Worker is created once its Master has an address). A cluster's DNS answers with the current
  endpoint on every lookup: when one changes (a recreated Master has a new address, a failed one
  none), the running pods' hosts files (the kubelet's etc-hosts, bind-mounted as /etc/hosts) are
  rewritten in place, so a pod started while the old Master still ran finds the new one, as
  torch's store client does by resolving the name again on each connect retry;
* PV controller: a pending claim is bound to a new hostPath volume under the tier's state dir
  (shared by both nodes, like an RWX filesystem), which is removed with the claim;
* garbage collector: pods of a deleted job are deleted; foreground deletion finishes once they
  are gone; ConfigMaps, Secrets, ServiceAccounts, Roles and RoleBindings whose owners (jobs)
  are all gone are deleted; the protection finalizers of deleted claims and volumes are removed.
* service account controller: the namespace's `default` ServiceAccount (no token);
* root CA publisher: the namespace's `kube-root-ca.crt` ConfigMap (the apiserver's CA), which the
  projected service-account volume the apiserver's admission adds to pods mounts as `ca.crt`.

A pod creation the apiserver refuses (its ServiceAccount is not there yet) is tried again after
a short, growing delay, as the operator's rate-limited work queue does, not at the next resync.

The tier's image is a busybox rootfs: the pods' python, torch and dist-jobs come from read-only
hostPath mounts this controller adds to containers of that image, as a cluster's admission
webhook would (`--mounts`).

Usage: controller.py --kubeconfig K --state DIR --nodes IP1,IP2 --mounts P1:P2:... [--root-ca CA] [--cleanup]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from kubernetes import config
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from support.operator_harness import _metadata, defaulted, operator_env, retries

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainjob

NAMESPACE = "dist-jobs-pods"
GROUP = "/apis/kubeflow.org/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
JOB_LABEL = "training.kubeflow.org/job-name"
TIER_LABEL = "dist-jobs-pods/tier"
IMAGE_PREFIX = "localhost/dist-jobs-runtime:"
MERGE = "application/merge-patch+json"
# How long one watch request lasts before it is made again (the apiserver caps it too).
WATCH_SECONDS = 300
# The longest pause between two failed watches of a kind (the resync's passes go on meanwhile).
WATCH_RETRY_MAX_SECONDS = 10.0
# After a change, how long the loop waits for the rest of a burst before its pass.
BATCH_SECONDS = 0.1
# A pass whose writes the apiserver refused runs again after this, doubled at each further
# failure up to the resync (the operator's work queue requeues a failed key rate-limited).
RETRY_SECONDS = 0.25
# Kinds whose objects the garbage collector deletes once every owner (a job) is gone; the pods,
# Services and Endpoints of jobs are handled on their own. The sweep lists them all, so it runs
# when a job has gone since the last pass, and every GC_SWEEP_SECONDS for the stragglers (an
# object created after its job was deleted).
OWNED_KINDS = ("configmaps", "secrets", "serviceaccounts", "roles", "rolebindings")
OWNER_KINDS = ("PyTorchJob", "TrainJob")
GC_SWEEP_SECONDS = 30.0
ROOT_CA = "kube-root-ca.crt"


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(msg: str) -> None:
    print(f"[controller {datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


class Api:
    """JSON in, JSON out, against the apiserver with the admin kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        self.client = config.new_client_from_config(config_file=kubeconfig)

    def call(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None, ctype: str = ""
    ) -> Any:
        headers = self.headers(ctype)
        resp = self.client.rest_client.request(
            method, self.url(path, query), headers=headers, body=body, _request_timeout=30
        )
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)
        return json.loads(data) if data else {}

    def headers(self, ctype: str = "") -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": ctype or "application/json"}
        for auth in self.client.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        return self.client.configuration.host.rstrip("/") + path + ("?" + urlencode(query) if query else "")

    def follow(self, path: str, seconds: int, changed: threading.Event) -> None:
        """Watch the collection at `path` for up to `seconds` from its current version, setting
        `changed` at once and at every event the apiserver streams."""
        version = (self.call("GET", path, query={"limit": "1"}).get("metadata") or {}).get("resourceVersion", "")
        changed.set()  # whatever happened before this watch began
        query = {"watch": "1", "resourceVersion": version, "timeoutSeconds": str(seconds)}
        # The client's response is not read yet (it reads on .read()): its urllib3 response streams.
        resp = self.client.rest_client.request(
            "GET", self.url(path, query), headers=self.headers(), _request_timeout=(10, seconds + 30)
        )
        try:
            if not 200 <= resp.status <= 299:
                raise ApiException(http_resp=resp)
            for _ in resp.response.stream(4096):  # each chunk holds events; what they say, a pass reads
                changed.set()
        finally:
            resp.response.release_conn()

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        try:
            return self.call("GET", path, query=query)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        found = self.get(path, {"labelSelector": selector} if selector else None)
        return list((found or {}).get("items") or [])

    def create(self, path: str, body: dict[str, Any]) -> None:
        try:
            self.call("POST", path, body)
        except ApiException as exc:
            if exc.status != 409:  # already there: a previous pass made it
                raise

    def delete(self, path: str, grace: int | None = None) -> None:
        query = {} if grace is None else {"gracePeriodSeconds": str(grace)}
        try:
            self.call("DELETE", path, query=query)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def patch(self, path: str, body: dict[str, Any]) -> None:
        try:
            self.call("PATCH", path, body, ctype=MERGE)
        except ApiException as exc:
            if exc.status != 404:
                raise


def ns_path(kind: str, name: str = "") -> str:
    if kind == "pytorchjobs":
        base = f"{GROUP}/namespaces/{NAMESPACE}/pytorchjobs"
    elif kind in ("roles", "rolebindings"):
        base = f"{RBAC}/namespaces/{NAMESPACE}/{kind}"
    else:
        base = f"/api/v1/namespaces/{NAMESPACE}/{kind}"
    return f"{base}/{name}" if name else base


# -- the scheduler's node filter --------------------------------------------------------------


def _requirement_met(req: dict[str, Any], value: str | None) -> bool:
    """One node selector requirement against a node's label (or field) value, None if unset."""
    op, values = req.get("operator"), [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            have, want = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_matches(term: dict[str, Any], node: dict[str, Any]) -> bool:
    """A nodeSelectorTerm: its requirements ANDed; an empty term matches no node."""
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False
    labels = node["metadata"].get("labels") or {}
    for req in exprs:
        if not _requirement_met(req, labels.get(req.get("key", ""))):
            return False
    for req in fields:
        # the only field a node selector may name (the API refuses others)
        if req.get("key") != "metadata.name" or req.get("operator") not in ("In", "NotIn"):
            return False
        if not _requirement_met(req, node["metadata"]["name"]):
            return False
    return True


def unfit(spec: dict[str, Any], node: dict[str, Any]) -> str | None:
    """Why the pod spec may not run on `node` (None: it may): its nodeSelector and the required
    node affinity's nodeSelectorTerms (ORed), as the scheduler's NodeAffinity filter decides."""
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None and not any(_term_matches(t, node) for t in required.get("nodeSelectorTerms") or []):
        return "required node affinity"
    return None


def place(spec: dict[str, Any], default: str, nodes: list[dict[str, Any]]) -> tuple[str | None, str]:
    """The node a pod spec goes to: `default` (the tier's usual placement) if it fits, else the
    first of `nodes` that does; None and why when none does."""
    if default in [n["metadata"]["name"] for n in nodes]:
        nodes = sorted(nodes, key=lambda n: n["metadata"]["name"] != default)
    reasons = []
    for node in nodes:
        why = unfit(spec, node)
        if why is None:
            return node["metadata"]["name"], ""
        reasons.append(f"{node['metadata']['name']}: {why}")
    return None, f"0/{len(nodes)} nodes are available ({'; '.join(reasons) or 'no nodes'})"


def owned_garbage(objects: list[dict[str, Any]], live: set[str]) -> list[dict[str, Any]]:
    """Objects owned by jobs only, none of which is live (by uid): the garbage collector's."""
    out = []
    for obj in objects:
        owners = obj["metadata"].get("ownerReferences") or []
        if not owners or obj["metadata"].get("deletionTimestamp"):
            continue
        if all(o.get("kind") in OWNER_KINDS for o in owners) and not any(o.get("uid") in live for o in owners):
            out.append(obj)
    return out


# -- pods as the operator makes them -----------------------------------------------------------


def expected_pods(job: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(name, replica type, index) of every pod of a defaulted job, Master first."""
    out = []
    replicas = job["spec"]["pytorchReplicaSpecs"]
    for rtype in sorted(replicas, key=lambda r: r != "Master"):
        for index in range(int(replicas[rtype]["replicas"])):
            out.append((f"{job['metadata']['name']}-{rtype.lower()}-{index}", rtype, index))
    return out


class Controller:
    def __init__(self, api: Api, state: Path, nodes: list[str], mounts: list[str], root_ca: str | None = None) -> None:
        self.api, self.state, self.nodes = api, state, nodes
        self.mounts = mounts
        self.root_ca = root_ca  # the PEM the kube-root-ca.crt ConfigMap publishes (None: none)
        self.hosts_seen: dict[str, dict[str, str]] = {}  # pod uid -> the names its hosts file gives
        self.unschedulable: dict[str, str] = {}  # pod name -> why it fits no node (logged once)
        self.node_cache: list[dict[str, Any]] | None = None  # the nodes, listed once per pass
        self.failed = False  # a write of this pass was refused: run again soon
        self.job_uids: set[str] | None = None  # the jobs of the last pass (None: no pass yet)
        self.swept = 0.0  # when the owned kinds were last swept for garbage

    # -- the tier's admission: the runtime comes from read-only host mounts -------------------
    def admit(self, spec: dict[str, Any]) -> None:
        containers = [c for c in spec.get("containers", []) if str(c.get("image", "")).startswith(IMAGE_PREFIX)]
        if not containers:
            return
        volumes = spec.setdefault("volumes", [])
        for i, path in enumerate(self.mounts):
            name = f"dist-jobs-runtime-{i}"
            volumes.append({"name": name, "hostPath": {"path": path, "type": "Directory"}})
            for container in containers:
                mount = {"name": name, "mountPath": path, "readOnly": True}
                container.setdefault("volumeMounts", []).append(mount)

    def pod_body(
        self, job: dict[str, Any], rtype: str, index: int, aliases: dict[str, str], node: str | None = None
    ) -> dict[str, Any]:
        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        metadata = _metadata(job, replica, rtype, index)
        if rtype == "Master":
            metadata["labels"]["training.kubeflow.org/job-role"] = "master"
        metadata["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": job["metadata"]["name"],
                "uid": job["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        spec = copy.deepcopy(replica["template"]["spec"])
        for container in spec["containers"]:
            if container["name"] == "pytorch":
                added = [{"name": k, "value": v} for k, v in operator_env(job, rtype, index)]
                container["env"] = [*(container.get("env") or []), *added]
        policy = replica["restartPolicy"]
        spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        # No automountServiceAccountToken here: the pod's ServiceAccount decides (the `default`
        # one this controller makes says no), as the operator leaves it to the template.
        spec["nodeName"] = node or self.pod_node(job, metadata["name"])
        spec["hostAliases"] = [{"ip": ip, "hostnames": [name]} for name, ip in sorted(aliases.items())]
        self.admit(spec)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def ensure_service(
        self, job: dict[str, Any], name: str, rtype: str, index: int, pod: dict[str, Any] | None
    ) -> None:
        labels = {JOB_LABEL: job["metadata"]["name"], TIER_LABEL: "1"}
        port = (
            int(dict(operator_env(job, "Master", 0)).get("MASTER_PORT", "23456"))
            if "Master" in job["spec"]["pytorchReplicaSpecs"]
            else 23456
        )
        if self.api.get(ns_path("services", name)) is None:
            selector = {
                JOB_LABEL: job["metadata"]["name"],
                "training.kubeflow.org/replica-type": rtype.lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
            self.api.create(
                ns_path("services"),
                {
                    "metadata": {"name": name, "labels": labels},
                    "spec": {
                        "clusterIP": "None",
                        "selector": selector,
                        "ports": [{"name": "pytorchjob-port", "port": port}],
                    },
                },
            )
        ip = ((pod or {}).get("status") or {}).get("podIP")
        subsets = (
            [{"addresses": [{"ip": ip}], "ports": [{"name": "pytorchjob-port", "port": port}]}]
            if ip and alive(pod)
            else []
        )
        current = self.api.get(ns_path("endpoints", name))
        if current is None:
            self.api.create(ns_path("endpoints"), {"metadata": {"name": name, "labels": labels}, "subsets": subsets})
        elif (current.get("subsets") or []) != subsets:
            self.api.call("PUT", ns_path("endpoints", name), {**current, "subsets": subsets})

    # -- the reconcile of one job ---------------------------------------------------------------
    def reconcile(self, raw: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        job = defaulted(raw)
        name = job["metadata"]["name"]
        mine = {p["metadata"]["name"]: p for p in pods if p["metadata"].get("labels", {}).get(JOB_LABEL) == name}
        if job["metadata"].get("deletionTimestamp"):
            self.finish_deletion(job, mine)
            return
        status = copy.deepcopy(job.get("status") or {})
        ended = any(
            c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in status.get("conditions") or []
        )
        expected = expected_pods(job)
        if not ended:
            self.bind_claims(job)
            ended = self.drive(job, expected, mine, status)
        self.write_status(job, expected, mine, status)

    def drive(
        self, job: dict[str, Any], expected: list[tuple[str, str, int]], mine: dict[str, Any], status: dict[str, Any]
    ) -> bool:
        """Create, recreate and judge pods; True once the job has ended."""
        backoff = job["spec"].get("runPolicy", {}).get("backoffLimit")
        jname = job["metadata"]["name"]
        # A pod's Service endpoint (the DNS answer) only while it is alive: a Worker recreated
        # while the failed Master it would name is still listed must wait for the new Master.
        aliases = {}
        for pname, _, _ in expected:
            pod = mine.get(pname)
            ip = ((pod or {}).get("status") or {}).get("podIP")
            if ip and alive(pod):
                aliases[pname] = ip
        self.follow_dns(mine, aliases)
        has_master = any(r == "Master" for _, r, _ in expected)
        for pname, rtype, index in expected:
            pod = mine.get(pname)
            self.ensure_service(job, pname, rtype, index, pod)
            if pod is None:
                # The Master's (an elastic job's: worker 0's, the rendezvous host's) Service
                # endpoint, the DNS answer the others need, is not there yet.
                master = expected[0][0]
                if pname != master and master not in aliases:
                    continue
                # The job's current template: a patch of it takes effect at the next (re)creation.
                template = job["spec"]["pytorchReplicaSpecs"][rtype]["template"].get("spec") or {}
                node = self.schedule(pname, template, self.pod_node(job, pname))
                if node is None:
                    continue
                others = {k: v for k, v in aliases.items() if k != pname}
                self.api.create(ns_path("pods"), self.pod_body(job, rtype, index, others, node))
                log(f"created pod {pname} on {node}")
                continue
            if pod["metadata"].get("deletionTimestamp"):
                continue
            phase = pod["status"].get("phase")
            code = exit_code(pod)
            policy = job["spec"]["pytorchReplicaSpecs"][rtype]["restartPolicy"]
            if phase == "Succeeded" and (rtype == "Master" or not has_master):
                if not has_master and not all(
                    mine.get(n, {}).get("status", {}).get("phase") == "Succeeded" for n, _, _ in expected
                ):
                    continue
                set_condition(
                    status,
                    "Succeeded",
                    "PyTorchJobSucceeded",
                    f"PyTorchJob {job['metadata']['name']} is successfully completed.",
                )
                log(f"job {job['metadata']['name']} succeeded")
                return True
            if phase == "Failed":
                if backoff == 0 or not (policy == "ExitCode" and retries("ExitCode", code)):
                    msg = f"PyTorchJob {jname} is failed because 1 {rtype} replica(s) failed (exit code {code})."
                    set_condition(status, "Failed", "PyTorchJobFailed", msg)
                    log(msg)
                    return True
                msg = f"PyTorchJob {jname} is restarting because 1 {rtype} replica(s) failed (exit code {code})."
                set_condition(status, "Restarting", "PyTorchJobRestarting", msg)
                log(f"{msg} deleting {pname}; its log: {self.keep_log(pod)}")
                self.api.delete(ns_path("pods", pname), grace=0)
            elif policy == "OnFailure" and backoff is not None and restarts(pod) > backoff:
                set_condition(
                    status,
                    "Failed",
                    "PyTorchJobFailed",
                    f"PyTorchJob {jname} has failed because it has reached the specified backoff limit",
                )
                return True
        if any(mine.get(n, {}).get("status", {}).get("phase") == "Running" for n, _, _ in expected):
            running = [c for c in status.get("conditions") or [] if c["type"] == "Running" and c["status"] == "True"]
            restarting = [
                c for c in status.get("conditions") or [] if c["type"] == "Restarting" and c["status"] == "True"
            ]
            if not running or restarting:
                set_condition(
                    status, "Running", "PyTorchJobRunning", f"PyTorchJob {job['metadata']['name']} is running."
                )
        return False

    def follow_dns(self, pods: dict[str, dict[str, Any]], endpoints: dict[str, str]) -> None:
        """Each running pod's hosts file names the others by their current endpoints (none for a
        pod that has ended), as cluster DNS would answer now."""
        for pname, pod in pods.items():
            uid = pod["metadata"]["uid"]
            want = {k: v for k, v in endpoints.items() if k != pname}
            had = self.hosts_seen.get(uid)
            if had is None:  # what the kubelet wrote from the pod's hostAliases
                had = {a["hostnames"][0]: a["ip"] for a in (pod.get("spec") or {}).get("hostAliases") or []}
            if not alive(pod) or want == had:
                self.hosts_seen[uid] = had
                continue
            path = self.hosts_file(pod)
            if path is None:
                continue
            rewrite_aliases(path, want)
            self.hosts_seen[uid] = want
            log(f"{pname}: hosts now {sorted(want.items())}")

    def hosts_file(self, pod: dict[str, Any]) -> Path | None:
        """The kubelet's etc-hosts of the pod (None until the kubelet has written it)."""
        node = (pod.get("spec") or {}).get("nodeName")
        root = self.kubelet_root(self.nodes.index(node) + 1) if node in self.nodes else None
        path = root / "pods" / pod["metadata"]["uid"] / "etc-hosts" if root else None
        return path if path and path.is_file() else None

    def kubelet_root(self, node: int) -> Path | None:
        """Node `node`'s /var/lib/kubelet, seen through its kubelet's own mount namespace."""
        try:
            pid = int((self.state / f"node{node}" / "kubelet.pid").read_text())
        except (OSError, ValueError):
            return None
        return Path(f"/proc/{pid}/root/var/lib/kubelet")

    def keep_log(self, pod: dict[str, Any]) -> Path:
        """The log of a pod about to be deleted, kept in the state dir (the kubelet drops it)."""
        meta = pod["metadata"]
        path = self.state / "pod-logs" / f"{meta['name']}.{meta['uid']}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            url = f"{ns_path('pods', meta['name'])}/log?container=pytorch"
            headers = {"Authorization": self.api.client.configuration.auth_settings()["BearerToken"]["value"]}
            resp = self.api.client.rest_client.request(
                "GET", self.api.client.configuration.host + url, headers=headers, _request_timeout=30
            )
            path.write_bytes(resp.read())
        except Exception as exc:  # a log we cannot read must not stop the restart
            path.write_text(f"log not readable: {exc}\n")
        return path

    def pod_node(self, job: dict[str, Any], pname: str) -> str:
        """The tier's placement without constraints: the Master on node 1, Workers alternating."""
        order = [n for n, _, _ in expected_pods(job)]
        return self.nodes[order.index(pname) % len(self.nodes)]

    def schedule(self, pname: str, spec: dict[str, Any], default: str) -> str | None:
        """The node for a new pod (None: none fits, the pod waits; why is logged once)."""
        if self.node_cache is None:
            listed = (self.api.get("/api/v1/nodes") or {}).get("items") or []
            by_name = {n["metadata"]["name"]: n for n in listed}
            self.node_cache = [by_name[n] for n in self.nodes if n in by_name]
        node, why = place(spec, default, self.node_cache)
        if node is None:
            if self.unschedulable.get(pname) != why:
                log(f"pod {pname} is unschedulable, not created: {why}")
            self.unschedulable[pname] = why
            return None
        self.unschedulable.pop(pname, None)
        return node

    def write_status(
        self, job: dict[str, Any], expected: list[tuple[str, str, int]], mine: dict[str, Any], status: dict[str, Any]
    ) -> None:
        if not status.get("conditions"):
            set_condition(status, "Created", "PyTorchJobCreated", f"PyTorchJob {job['metadata']['name']} is created.")
        counts: dict[str, dict[str, int]] = {}
        for pname, rtype, _ in expected:
            # every key, zeros included: a merge patch would keep a count this pass leaves out
            c = counts.setdefault(rtype, {"active": 0, "succeeded": 0, "failed": 0})
            phase = mine.get(pname, {}).get("status", {}).get("phase")
            key = {"Running": "active", "Pending": "active", "Succeeded": "succeeded", "Failed": "failed"}.get(
                phase or ""
            )
            if key:
                c[key] = c.get(key, 0) + 1
        status["replicaStatuses"] = counts
        if status != (job.get("status") or {}):
            status.setdefault("startTime", now())
            if any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in status["conditions"]):
                status.setdefault("completionTime", now())
            self.api.patch(f"{ns_path('pytorchjobs', job['metadata']['name'])}/status", {"status": status})

    def finish_deletion(self, job: dict[str, Any], mine: dict[str, Any]) -> None:
        """The garbage collector's foreground deletion: pods first, then the job."""
        for pname, pod in mine.items():
            if not pod["metadata"].get("deletionTimestamp"):
                log(f"job {job['metadata']['name']} deleted: deleting pod {pname}")
                self.api.delete(ns_path("pods", pname))
        if mine:
            return
        self.delete_services(job["metadata"]["name"])
        if job["metadata"].get("finalizers"):
            self.api.patch(ns_path("pytorchjobs", job["metadata"]["name"]), {"metadata": {"finalizers": None}})

    def delete_services(self, job_name: str) -> None:
        for kind in ("services", "endpoints"):
            for obj in self.api.items(ns_path(kind), f"{JOB_LABEL}={job_name},{TIER_LABEL}=1"):
                self.api.delete(ns_path(kind, obj["metadata"]["name"]))

    # -- volumes --------------------------------------------------------------------------------
    def bind_claims(self, job: dict[str, Any]) -> None:
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            for volume in replica["template"]["spec"].get("volumes") or []:
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim:
                    self.bind(claim)

    def bind(self, claim: str) -> None:
        pvc = self.api.get(ns_path("persistentvolumeclaims", claim))
        if pvc is None or (pvc.get("status") or {}).get("phase") == "Bound" or pvc["metadata"].get("deletionTimestamp"):
            return
        pv_name = f"{NAMESPACE}-{claim}"
        path = self.state / "volumes" / NAMESPACE / claim
        path.mkdir(parents=True, exist_ok=True)
        size = ((pvc["spec"].get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        modes = pvc["spec"].get("accessModes") or ["ReadWriteMany"]
        claim_ref = {
            "kind": "PersistentVolumeClaim",
            "namespace": NAMESPACE,
            "name": claim,
            "uid": pvc["metadata"]["uid"],
        }
        self.api.create(
            "/api/v1/persistentvolumes",
            {
                "metadata": {"name": pv_name, "labels": {TIER_LABEL: "1"}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": modes,
                    "persistentVolumeReclaimPolicy": "Delete",
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "claimRef": claim_ref,
                },
            },
        )
        self.api.patch(f"/api/v1/persistentvolumes/{pv_name}", {"spec": {"claimRef": claim_ref}})
        self.api.patch(f"/api/v1/persistentvolumes/{pv_name}/status", {"status": {"phase": "Bound"}})
        self.api.patch(ns_path("persistentvolumeclaims", claim), {"spec": {"volumeName": pv_name}})
        body = {"status": {"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}}}
        self.api.patch(f"{ns_path('persistentvolumeclaims', claim)}/status", body)
        log(f"bound claim {claim} to {pv_name} ({path})")

    def collect(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """Garbage: pods of jobs that are gone, deleted claims, volumes without their claim, and
        the objects of OWNED_KINDS that only gone jobs own."""
        uids = {j["metadata"]["uid"] for j in jobs}
        gone = self.job_uids is None or bool(self.job_uids - uids)
        self.job_uids = uids
        if gone or time.monotonic() - self.swept >= GC_SWEEP_SECONDS:
            self.collect_owned(uids)
        names = {j["metadata"]["name"] for j in jobs}
        for pod in pods:
            owners = [
                o["uid"]
                for o in pod["metadata"].get("ownerReferences") or []
                if o.get("kind") in ("PyTorchJob", "TrainJob")
            ]
            if owners and owners[0] not in uids and not pod["metadata"].get("deletionTimestamp"):
                log(f"owner of pod {pod['metadata']['name']} is gone: deleting it")
                self.api.delete(ns_path("pods", pod["metadata"]["name"]))
        for svc in self.api.items(ns_path("services"), TIER_LABEL + "=1"):
            if svc["metadata"]["labels"].get(JOB_LABEL) not in names:
                self.delete_services(svc["metadata"]["labels"].get(JOB_LABEL, ""))
        claims = {c["metadata"]["name"]: c for c in self.api.items(ns_path("persistentvolumeclaims"))}
        for claim in claims.values():
            if claim["metadata"].get("deletionTimestamp") and claim["metadata"].get("finalizers"):
                users = [
                    p
                    for p in pods
                    if any(
                        (v.get("persistentVolumeClaim") or {}).get("claimName") == claim["metadata"]["name"]
                        for v in p["spec"].get("volumes") or []
                    )
                ]
                if not users:
                    self.api.patch(
                        ns_path("persistentvolumeclaims", claim["metadata"]["name"]), {"metadata": {"finalizers": None}}
                    )
        for pv in self.api.items("/api/v1/persistentvolumes", TIER_LABEL + "=1"):
            ref = pv["spec"].get("claimRef") or {}
            live = claims.get(ref.get("name", ""))
            if live is None or live["metadata"]["uid"] != ref.get("uid"):
                self.delete_volume(pv)

    def collect_owned(self, live: set[str]) -> None:
        self.swept = time.monotonic()
        for kind in OWNED_KINDS:
            for obj in owned_garbage(self.api.items(ns_path(kind)), live):
                log(f"owner of {kind} {obj['metadata']['name']} is gone: deleting it")
                self.api.delete(ns_path(kind, obj["metadata"]["name"]))

    def delete_volume(self, pv: dict[str, Any]) -> None:
        name = pv["metadata"]["name"]
        path = Path((pv["spec"].get("hostPath") or {}).get("path", ""))
        self.api.delete(f"/api/v1/persistentvolumes/{name}")
        self.api.patch(f"/api/v1/persistentvolumes/{name}", {"metadata": {"finalizers": None}})
        if path.is_relative_to(self.state / "volumes"):
            shutil.rmtree(path, ignore_errors=True)
        log(f"removed volume {name}")

    # -- the loop -------------------------------------------------------------------------------
    def ensure_namespace(self) -> None:
        if self.api.get(f"/api/v1/namespaces/{NAMESPACE}") is None:
            self.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        if self.api.get(ns_path("serviceaccounts", "default")) is None:
            self.api.create(
                ns_path("serviceaccounts"), {"metadata": {"name": "default"}, "automountServiceAccountToken": False}
            )
        self.publish_root_ca()

    def publish_root_ca(self) -> None:
        """kube-controller-manager's root CA publisher: the ConfigMap `kube-root-ca.crt` holds the
        apiserver's CA (the projected token volume of every pod that mounts a token reads it)."""
        if not self.root_ca:
            return
        data = {"ca.crt": self.root_ca}
        found = self.api.get(ns_path("configmaps", ROOT_CA))
        if found is None:
            self.api.create(ns_path("configmaps"), {"metadata": {"name": ROOT_CA}, "data": data})
        elif found.get("data") != data:
            self.api.call("PUT", ns_path("configmaps", ROOT_CA), {**found, "data": data})

    def once(self) -> None:
        self.failed = False
        self.node_cache = None
        self.ensure_namespace()
        jobs = self.api.items(ns_path("pytorchjobs"))
        pods = self.api.items(ns_path("pods"))
        for pvc in self.api.items(ns_path("persistentvolumeclaims")):
            if (pvc.get("status") or {}).get("phase") != "Bound":
                self.bind(pvc["metadata"]["name"])
        for job in jobs:
            try:
                self.reconcile(job, pods)
            except ApiException as exc:
                self.failed = True
                log(f"reconcile of {job['metadata']['name']}: HTTP {exc.status}: {str(exc.body)[:300]}")
        trainjobs = self.api.items(trainjob.path(NAMESPACE))
        for tj in trainjobs:
            try:
                self.reconcile_trainjob(tj, pods)
            except ApiException as exc:
                self.failed = True
                log(f"reconcile of TrainJob {tj['metadata']['name']}: HTTP {exc.status}: {str(exc.body)[:300]}")
        self.collect(jobs + trainjobs, pods)
        live = {p["metadata"]["uid"] for p in pods}
        self.hosts_seen = {uid: names for uid, names in self.hosts_seen.items() if uid in live}

    # -- TrainJobs (trainjob.py) ------------------------------------------------------------------
    def reconcile_trainjob(self, tj: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        name = tj["metadata"]["name"]
        label = f"{trainjob.JOBSET}jobset-name"
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(label) == name]
        if tj["metadata"].get("deletionTimestamp"):
            self.finish_trainjob_deletion(tj, mine)
            return
        by_index = {
            i: p for p in mine if (i := trainjob.index_of(p)) is not None and not p["metadata"].get("deletionTimestamp")
        }
        status = copy.deepcopy(tj.get("status") or {})
        conditions = status.get("conditions") or []
        ended = next(
            (c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None
        )
        if ended is None:
            for volume in trainjob.patched_template(tj)["spec"].get("volumes") or []:
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                if claim:
                    self.bind(claim)
            self.create_trainjob_pods(tj, by_index)
            ended, message = trainjob.judged(tj, by_index)
            if ended is not None:
                set_condition(status, ended, f"TrainJob{ended}", message)
                log(message)
        status["jobsStatus"] = trainjob.jobs_status(tj, by_index, ended)
        if status != (tj.get("status") or {}):
            self.api.patch(f"{trainjob.path(NAMESPACE, name)}/status", {"status": status})

    def create_trainjob_pods(self, tj: dict[str, Any], by_index: dict[int, dict[str, Any]]) -> None:
        count = int((tj["spec"].get("trainer") or {}).get("numNodes", 1))
        first_ip = ((by_index.get(0) or {}).get("status") or {}).get("podIP")
        for index in range(count):
            if index in by_index:
                continue
            if index > 0 and not first_ip:
                continue  # the master name's DNS answer (pod 0's address) is not there yet
            body = trainjob.pod_body(tj, index, self.nodes[index % len(self.nodes)], first_ip or "127.0.0.1")
            node = self.schedule(f"{tj['metadata']['name']}-{index}", body["spec"], body["spec"]["nodeName"])
            if node is None:
                continue
            body["spec"]["nodeName"] = node
            self.admit(body["spec"])
            self.api.create(ns_path("pods"), body)
            log(f"created pod {body['metadata']['name']} on {body['spec']['nodeName']}")

    def finish_trainjob_deletion(self, tj: dict[str, Any], mine: list[dict[str, Any]]) -> None:
        for pod in mine:
            if not pod["metadata"].get("deletionTimestamp"):
                self.api.delete(ns_path("pods", pod["metadata"]["name"]))
        if not mine and tj["metadata"].get("finalizers"):
            self.api.patch(trainjob.path(NAMESPACE, tj["metadata"]["name"]), {"metadata": {"finalizers": None}})


def alive(pod: dict[str, Any] | None) -> bool:
    """What the endpoints controller serves: a pod not being deleted that has not ended."""
    return (
        pod is not None
        and not pod["metadata"].get("deletionTimestamp")
        and pod["status"].get("phase") in ("Pending", "Running")
    )


ALIASES_HEADER = "# Entries added by HostAliases."  # the kubelet's, above the hostAliases lines


def rewrite_aliases(path: Path, names: dict[str, str]) -> None:
    """The hostAliases section of a kubelet's etc-hosts replaced by `names`, in place: the file is
    bind-mounted into the container, so the inode must stay."""
    text = path.read_text()
    head = text.split(ALIASES_HEADER)[0].rstrip("\n")
    lines = [f"{ip}\t{name}" for name, ip in sorted(names.items())]
    with path.open("r+") as fh:
        fh.write("\n".join([head, "", ALIASES_HEADER, *lines]) + "\n")
        fh.truncate()


def exit_code(pod: dict[str, Any]) -> int:
    for status in pod["status"].get("containerStatuses") or []:
        if status["name"] == "pytorch":
            terminated = (status.get("state") or {}).get("terminated") or {}
            if "exitCode" in terminated:
                return int(terminated["exitCode"])
    return 128 + 9  # no container status (e.g. the node lost it): what a kill leaves


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount", 0)) for s in pod["status"].get("containerStatuses") or [])


def set_condition(status: dict[str, Any], ctype: str, reason: str, message: str) -> None:
    """The operator's updateJobConditions: the new condition last; Running and Restarting
    exclude each other, and an ended job is no longer Running."""
    conditions = status.setdefault("conditions", [])
    stamp = now()
    for c in conditions:
        if (
            ctype in ("Running", "Restarting", "Succeeded", "Failed")
            and c["type"] in ("Running", "Restarting")
            and c["type"] != ctype
        ):
            if c["status"] == "True":
                c.update(status="False", lastUpdateTime=stamp, lastTransitionTime=stamp)
    for c in conditions:
        if c["type"] == ctype:
            if c["status"] != "True" or c["message"] != message:
                conditions.remove(c)
                break
            return
    conditions.append(
        {
            "type": ctype,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": stamp,
            "lastTransitionTime": stamp,
        }
    )


def cleanup(api: Api, nodes: list[str], phase: str) -> None:
    """down.sh's API side. `pods`: the namespace and everything in it (there is no namespace
    controller to empty it), and the volumes; `nodes`: the nodes, their leases and events."""
    if phase == "pods":
        ctl = Controller(api, Path("/nonexistent"), nodes, [])
        for obj in api.items(trainjob.path(NAMESPACE)):
            api.delete(trainjob.path(NAMESPACE, obj["metadata"]["name"]), grace=0)
            if obj["metadata"].get("finalizers"):
                api.patch(trainjob.path(NAMESPACE, obj["metadata"]["name"]), {"metadata": {"finalizers": None}})
        for kind in (
            "pytorchjobs",
            "pods",
            "persistentvolumeclaims",
            "services",
            "endpoints",
            "serviceaccounts",
            "configmaps",
            "secrets",
            "roles",
            "rolebindings",
            "events",
        ):
            for obj in api.items(ns_path(kind)):
                path = ns_path(kind, obj["metadata"]["name"])
                api.delete(path, grace=0)
                if obj["metadata"].get("finalizers"):
                    api.patch(path, {"metadata": {"finalizers": None}})
        for pv in api.items("/api/v1/persistentvolumes", TIER_LABEL + "=1"):
            ctl.delete_volume(pv)
        api.delete(f"/api/v1/namespaces/{NAMESPACE}")
        ns = api.get(f"/api/v1/namespaces/{NAMESPACE}")
        if ns is not None:
            ns["spec"]["finalizers"] = []
            api.call("PUT", f"/api/v1/namespaces/{NAMESPACE}/finalize", ns)
        return
    for node in nodes:
        api.delete(f"/api/v1/nodes/{node}")
        api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
    for event in api.items("/api/v1/namespaces/default/events"):
        if (event.get("involvedObject") or {}).get("name") in nodes:
            api.delete(f"/api/v1/namespaces/default/events/{event['metadata']['name']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--mounts", default="")
    parser.add_argument("--cleanup", choices=["pods", "nodes"])
    parser.add_argument("--root-ca", default="", help="the CA the kube-root-ca.crt ConfigMap publishes")
    # A pass runs when a watched collection changes (as an operator's informers wake it), not on a
    # timer: a pass lists every kind the controller drives, and a pass a second kept the apiserver,
    # etcd and this process busy with nothing to do (k8s/kubelet/README.md).
    parser.add_argument("--resync", type=float, default=10.0, help="seconds between passes when nothing changes")
    args = parser.parse_args()
    api = Api(args.kubeconfig)
    nodes = args.nodes.split(",")
    if args.cleanup:
        cleanup(api, nodes, args.cleanup)
        return
    mounts = dedupe([m for m in args.mounts.split(":") if m])
    root_ca = Path(args.root_ca).read_text() if args.root_ca else None
    ctl = Controller(api, Path(args.state), nodes, mounts, root_ca)
    ctl.ensure_namespace()
    (Path(args.state) / "controller.ready").touch()
    log(f"watching PyTorchJobs and TrainJobs in {NAMESPACE}; nodes {nodes}; runtime mounts {mounts}")
    changed = threading.Event()
    # ServiceAccounts too: a pod refused for want of its account is made as soon as it exists.
    watched = (
        ns_path("pytorchjobs"),
        ns_path("pods"),
        ns_path("persistentvolumeclaims"),
        ns_path("serviceaccounts"),
        trainjob.path(NAMESPACE),
    )
    for path in watched:
        threading.Thread(target=watching, args=(api, path, changed), daemon=True).start()
    failures = 0  # passes in a row with a refused write
    while True:
        changed.wait(min(RETRY_SECONDS * 2**failures, args.resync) if failures else args.resync)
        time.sleep(BATCH_SECONDS)  # one pass for a burst of events (a pass's own writes are some)
        changed.clear()  # before the pass: what changes during it wakes the next one
        try:
            ctl.once()
            failures = failures + 1 if ctl.failed else 0
        except Exception:  # the loop must survive a failed pass (an apiserver hiccup): log and go on
            failures += 1
            log(traceback.format_exc())


def watching(api: Api, path: str, changed: threading.Event) -> None:
    """Wake the loop at every change of `path`, for as long as the controller runs."""
    failed = 0  # watches in a row that failed: the pause grows, and only the first is logged
    while True:
        try:
            api.follow(path, WATCH_SECONDS, changed)
            failed = 0
        except Exception as exc:  # the apiserver restarted, a CRD was removed: watch again
            if not failed:
                log(f"watch of {path} failed: {type(exc).__name__}: {str(exc)[:200]} (trying again)")
            changed.set()
            time.sleep(min(2.0**failed, WATCH_RETRY_MAX_SECONDS))
            failed += 1


def dedupe(paths: list[str]) -> list[str]:
    """Drop paths under another one in the list: that mount brings them already."""
    keep = []
    for p in sorted(set(paths)):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in keep):
            keep.append(p)
    return keep


if __name__ == "__main__":
    main()
