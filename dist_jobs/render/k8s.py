"""The typed context of the Kubernetes templates (PyTorchJob and TrainJob).

Facts from the training operator (KUBERNETES_NOTES section 1) shape it: the container must be
named `pytorch` with a port named `pytorchjob-port`; the operator's RANK is a pod rank, so more
than one process per pod needs torchrun, which reads the operator's PET_* variables. A TrainJob
carries the pod-level settings through the v2.3 CRD's `runtimePatches` (k8s_rules refuses what
it cannot carry). The kubelet expands `$(VAR)` and `$$` in env values, command and args, so
every `$` there is written `$$` (quoting.kubelet_literal): values arrive exactly as written.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import msgspec

from dist_jobs.constants import LOCK_LOST_EXIT_CODE, REQUEUE_EXIT_CODE, TORCHRUN_MODULE
from dist_jobs.errors import SpecError
from dist_jobs.render.common import header_lines, template_dir, torchrun_tail
from dist_jobs.render.quoting import kubelet_literal, yaml_block
from dist_jobs.spec import JobSpec, k8s_rules
from dist_jobs.spec.env import job_env
from dist_jobs.spec.k8s_names import k8s_name
from dist_jobs.spec.paths import checkpoint_root

DEFAULT_PORT = 23456  # the operator's default for pytorchjob-port


# `snapshot: true`: the code as submitted travels in a ConfigMap (`<job>-code`, a gzipped tar that
# `dist-jobs submit` makes: dist_jobs.backends.k8s.code), mounted read-only; the pod entrypoint
# unpacks it into an emptyDir of the pod and runs the program there, on every start of the pod.
SNAPSHOT_KEY = "code.tar.gz"
SNAPSHOT_MOUNT = "/dist-jobs/snapshot"
CODE_DIR = "/dist-jobs/code"


# Run by the pod entrypoint after its start is counted, with `snapshot`: a snapshot that cannot be
# unpacked fails the job (exit 2: no restart mends it). Every start of the pod unpacks it again.
UNPACK = (
    'python3 -c \'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extractall(sys.argv[2], **({"filter": "data"}'
    ' if hasattr(tarfile, "data_filter") else {}))\' "$DIST_JOBS_SNAPSHOT" "$DIST_JOBS_CODE_DIR"'
    ' && cd "$DIST_JOBS_CODE_DIR" || exit 2\n'
)


def snapshot_configmap(spec: JobSpec) -> str:
    return f"{k8s_name(spec)}-code"


PATCH_MANAGER = "dist-jobs"  # runtimePatches entries are keyed by their manager
TRAINJOB_STEP = "node"  # the torch runtime's replicatedJob and container name


# Never the same bad node twice: a pod whose node is blamed patches its PyTorchJob's templates with
# a node affinity refusing it (dist_jobs.rundir.node_affinity). The pods run as a ServiceAccount
# whose Role may get and patch this one job; the job's name reaches them here, their node through
# the downward API.
JOB_ENV = "DIST_JOBS_K8S_JOB"
NODE_ENV = "DIST_JOBS_NODE"


def keeps_nodes_away(spec: JobSpec) -> bool:
    """Whether the job's pods patch its templates: PyTorchJobs (a TrainJob's pods restart in place)."""
    return spec.k8s.api == "pytorchjob" and spec.k8s.avoid_failed_nodes


def _access_name(spec: JobSpec) -> str:
    """The name of the job's own ServiceAccount, Role and RoleBinding."""
    return f"{k8s_name(spec)}-dist-jobs"


def service_account(spec: JobSpec) -> str | None:
    """The pods' ServiceAccount: the user's, else the job's own (made with it), else the namespace's."""
    if spec.k8s.service_account or not keeps_nodes_away(spec):
        return spec.k8s.service_account
    return _access_name(spec)


# What to do when the apiserver forbids creating one of them (403).
ACCESS_FORBIDDEN_HINT = (
    "the job's pods need these to keep a failed node away (k8s.avoid_failed_nodes): ask for the "
    "permission to create ServiceAccounts, Roles and RoleBindings in the namespace, or set "
    "k8s.avoid_failed_nodes: false"
)
ACCESS_KINDS = ("ServiceAccount", "Role", "RoleBinding")


def access_objects(spec: JobSpec) -> list[dict[str, Any]]:
    """The ServiceAccount (unless the user names one), Role and RoleBinding that let the job's pods
    get and patch their own PyTorchJob, and nothing else; none for a TrainJob."""
    if not keeps_nodes_away(spec):
        return []
    name, account = _access_name(spec), service_account(spec)
    labels = {"app.kubernetes.io/managed-by": "dist-jobs", "dist-jobs/run": k8s_name(spec)}
    meta = {"name": name, "namespace": spec.k8s.namespace, "labels": labels}
    rbac = "rbac.authorization.k8s.io"
    rule = {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "resourceNames": [k8s_name(spec)]}
    objects: list[dict[str, Any]] = []
    if not spec.k8s.service_account:
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    objects.append(
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta, "rules": [{**rule, "verbs": ["get", "patch"]}]}
    )
    subject = {"kind": "ServiceAccount", "name": account, "namespace": spec.k8s.namespace}
    role = {"apiGroup": rbac, "kind": "Role", "name": name}
    objects.append(
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": meta, "roleRef": role, "subjects": [subject]}
    )
    return objects


def access_manifest(spec: JobSpec) -> str:
    """`access_objects` as YAML documents to follow the job's manifest ("" for none)."""
    return "".join(f"---{yaml_block(obj, 0)}\n" for obj in access_objects(spec))


def pod_workdir(spec: JobSpec) -> PurePosixPath:
    """The folder a relative checkpoint_dir is below in a pod: the shared volume's mount."""
    return PurePosixPath(spec.k8s.mount_path)


def checkpoint_path(spec: JobSpec) -> str:
    """The checkpoint root as the pods see it (no `~` there: spec.k8s_rules refuses it)."""
    return str(checkpoint_root(spec.checkpoint_dir, pod_workdir(spec)))


def _memory(value: str | None) -> str | None:
    # SLURM's 64G is 64 GiB; Kubernetes' 64G would be 10^9-based.
    return None if value is None else (value + "i" if value[-1] in "KMGT" else value)


def _env(spec: JobSpec) -> list[dict[str, Any]]:
    values = job_env(spec, "k8s", checkpoint_path(spec))
    # The job across replaced pods: who may take over the run directory lock (dist_jobs.rundir).
    values.setdefault("DIST_JOBS_LOCK_OWNER", f"k8s:{spec.k8s.api}/{spec.k8s.namespace}/{k8s_name(spec)}")
    if spec.snapshot:  # the pod entrypoint unpacks the first into the second and runs from there
        values |= {"DIST_JOBS_SNAPSHOT": f"{SNAPSHOT_MOUNT}/{SNAPSHOT_KEY}", "DIST_JOBS_CODE_DIR": CODE_DIR}
    if keeps_nodes_away(spec):
        values.setdefault(JOB_ENV, k8s_name(spec))
    env: list[dict[str, Any]] = [{"name": k, "value": kubelet_literal(v)} for k, v in values.items()]
    env.append({"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    # `dist-jobs submit` stamps each submission on the pods (the attempts counter's key); from the
    # downward API, so `kubectl apply` of the same file works too (the value is then empty).
    path = f"metadata.annotations['{k8s_rules.SUBMISSION_ANNOTATION}']"
    env.append({"name": k8s_rules.SUBMISSION_ENV, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    return env


def container_command(spec: JobSpec) -> list[str]:
    """sh wrapper (forwards SIGTERM, caps restarts, maps preemption and a lost peer to the
    retryable exit code) + program, every `$` escaped for the kubelet."""
    text = (template_dir() / "pod-entrypoint.sh").read_text().replace("@REQUEUE@", str(REQUEUE_EXIT_CODE))
    text = text.replace("@LOCKLOST@", str(LOCK_LOST_EXIT_CODE))
    wrapper = "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"
    if spec.snapshot:  # after the first line, which counts this start of the pod
        first, rest = wrapper.split("\n", 1)
        wrapper = f"{first}\n{UNPACK}{rest}"
    if spec.k8s.launch == "direct":
        # One python per pod: the launcher turns the operator's pod RANK and WORLD_SIZE into the
        # whole env:// set (LOCAL_RANK, LOCAL_WORLD_SIZE, ...) before the program runs.
        program = ["python3", "-m", "dist_jobs.launch", "--", *spec.argv]
    else:
        program = ["python3", "-m", TORCHRUN_MODULE, f"--nproc-per-node={spec.procs}", *torchrun_tail(spec.argv)]
    return [kubelet_literal(arg) for arg in ["/bin/sh", "-c", wrapper, "dist-jobs-entrypoint", *program]]


def _resources(spec: JobSpec) -> dict[str, dict[str, Any]]:
    k8s = spec.k8s
    limits: dict[str, Any] = {}
    if spec.gpus_per_node:
        limits[k8s.gpu_resource] = spec.gpus_per_node
    memory = _memory(spec.memory)
    if memory:
        limits["memory"] = memory
    requests: dict[str, Any] = {"cpu": k8s.cpu_request or str(spec.cpus_per_task * spec.procs)}
    if k8s.memory_request or memory:
        requests["memory"] = k8s.memory_request or memory
    return {"limits": limits, "requests": requests} if limits else {"requests": requests}


def _volumes(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if spec.k8s.shm_size:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.k8s.shm_size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if spec.k8s.pvc:
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": spec.k8s.pvc}})
        mounts.append({"name": "shared", "mountPath": spec.k8s.mount_path})
    if spec.snapshot:
        volumes.append({"name": "dist-jobs-snapshot", "configMap": {"name": snapshot_configmap(spec)}})
        volumes.append({"name": "dist-jobs-code", "emptyDir": {}})
        mounts.append({"name": "dist-jobs-snapshot", "mountPath": SNAPSHOT_MOUNT, "readOnly": True})
        mounts.append({"name": "dist-jobs-code", "mountPath": CODE_DIR})
    return volumes, mounts


def _replicas(spec: JobSpec) -> list[tuple[str, int]]:
    if spec.k8s.min_nodes is not None and spec.k8s.min_nodes < (spec.k8s.max_nodes or 0):
        return [("Worker", spec.nodes)]  # elastic: every pod is a Worker, rendezvous at worker-0
    return [("Master", 1)] + ([("Worker", spec.nodes - 1)] if spec.nodes > 1 else [])


def _elastic(spec: JobSpec) -> dict[str, Any] | None:
    k8s = spec.k8s
    if k8s.min_nodes is None or k8s.max_nodes is None or k8s.min_nodes >= k8s.max_nodes:
        return None
    policy: dict[str, Any] = {"minReplicas": k8s.min_nodes, "maxReplicas": k8s.max_nodes, "rdzvBackend": "c10d"}
    if k8s.max_restarts is not None:
        policy["maxRestarts"] = k8s.max_restarts
    return policy


def _run_policy(spec: JobSpec) -> dict[str, Any]:
    k8s = spec.k8s
    policy: dict[str, Any] = {"cleanPodPolicy": "None"}
    # Under ExitCode the operator's backoffLimit caps nothing (kubeflow/trainer#2045) and 0 fails
    # even a preemption: the pod entrypoint counts the restarts (dist_jobs.rundir.attempts).
    if k8s.restart_policy != "ExitCode":
        policy["backoffLimit"] = k8s.backoff_limit if k8s.backoff_limit is not None else spec.preemption.max_requeues
    if k8s.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = k8s.ttl_seconds_after_finished
    if k8s.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = k8s.active_deadline_seconds
    scheduling = {k: v for k, v in (("queue", k8s.queue), ("priorityClass", k8s.priority_class)) if v}
    if scheduling:
        policy["schedulingPolicy"] = scheduling
    return policy


def _pod(spec: JobSpec, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    k8s = spec.k8s
    tolerations = [{k: v for k, v in msgspec.structs.asdict(t).items() if v is not None} for t in k8s.tolerations]
    pod = {
        "serviceAccountName": service_account(spec),
        "priorityClassName": k8s.priority_class,
        "nodeSelector": dict(k8s.node_selector) or None,
        "tolerations": tolerations or None,
        "imagePullSecrets": [{"name": s} for s in k8s.image_pull_secrets] or None,
        "volumes": volumes or None,
        # An eviction sends SIGTERM, then SIGKILL after this: time to commit the checkpoint.
        "terminationGracePeriodSeconds": spec.preemption.grace_seconds,
    }
    return {k: v for k, v in pod.items() if v is not None}


def _runtime_patches(spec: JobSpec, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod settings a TrainJob carries to the runtime's `node` pods (CRD v2.3 runtimePatches)."""
    metadata = {"labels": ctx["labels"], **({"annotations": ctx["annotations"]} if ctx["annotations"] else {})}
    container: dict[str, Any] = {"name": TRAINJOB_STEP}
    if ctx["mounts"]:
        container["volumeMounts"] = ctx["mounts"]
    pod = {**ctx["pod"], "containers": [container]}
    step = {"name": TRAINJOB_STEP, "template": {"spec": {"template": {"metadata": metadata, "spec": pod}}}}
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [step]}}}}]


def _header(spec: JobSpec) -> list[str]:
    header = header_lines(spec, "Apply with: kubectl apply -f THIS_FILE  (or: dist-jobs submit --backend k8s job.yaml)")
    if not spec.k8s.pvc:
        header.append("WARNING: no k8s.pvc: checkpoints stay inside the pod and are lost when it restarts.")
    if spec.snapshot:
        header.append(
            f"snapshot: the pods run the code in ConfigMap {snapshot_configmap(spec)}, which `dist-jobs submit` "
            "makes from the code at submit (see submit --dry-run)"
        )
    return header


def k8s_context(spec: JobSpec) -> dict[str, Any]:
    problems = k8s_rules.problems(spec)  # load_spec(backend="k8s") found them already; the API may not have
    if problems:
        raise SpecError(problems, "job spec (Kubernetes)")
    k8s = spec.k8s
    volumes, mounts = _volumes(spec)
    labels = {"app.kubernetes.io/managed-by": "dist-jobs", "dist-jobs/run": k8s_name(spec), **k8s.labels}
    ctx: dict[str, Any] = {
        "header": _header(spec),
        "name": k8s_name(spec),
        "namespace": k8s.namespace,
        "labels": labels,
        "annotations": dict(k8s.annotations),
        "nproc": str(spec.procs),
        "elastic": _elastic(spec),
        "run_policy": _run_policy(spec),
        "replicas": _replicas(spec),
        "restart_policy": k8s.restart_policy,
        "pod": _pod(spec, volumes),
        "image": spec.image,
        "pull_policy": k8s.image_pull_policy,
        "command": container_command(spec),
        "workdir": spec.workdir,
        "env": _env(spec),
        "port": spec.master_port or DEFAULT_PORT,
        "resources": _resources(spec),
        "mounts": mounts,
        "nodes": spec.nodes,
        "procs": spec.procs,
        "runtime": k8s.runtime,
        "active_deadline": k8s.active_deadline_seconds,
        "requeue_code": REQUEUE_EXIT_CODE,
    }
    ctx["runtime_patches"] = _runtime_patches(spec, ctx) if k8s.api == "trainjob" else []
    return ctx
