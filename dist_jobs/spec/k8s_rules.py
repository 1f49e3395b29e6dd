"""What Kubernetes and its operators would refuse or quietly change, found when the spec is loaded.

`problems(spec)` is every such problem at once (field, value, what is wrong, the fix), so a job
for `--backend k8s` fails with exit 2 before anything reaches a server, instead of a 422 from the
apiserver, or worse, an object the apiserver accepts and the operator then cannot run: a bad
label on the pod template, a toleration, a PVC name or an image reference only fail when the
operator creates the pods. Sources: Kubernetes' pod validation (pkg/apis/core/validation), the
training operator v1.9 (pkg/controller.v1/pytorch/envvar.go), Kubeflow Trainer v2.3 (the torch
plugin's reserved variables, the TrainJob CRD's runtimePatches) and JobSet v0.12's webhook.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable

from dist_jobs.errors import MISSING, Problem
from dist_jobs.spec import k8s_names as names
from dist_jobs.spec.model import JobSpec, K8sSpec

# training-operator v1.9 setPodEnv appends these after the container's own env, so its values win.
PYTORCHJOB_ENV = frozenset(
    {
        "PYTHONUNBUFFERED",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "PET_NODE_RANK",
        "PET_NPROC_PER_NODE",
        "PET_NNODES",
        "PET_RDZV_ENDPOINT",
        "PET_RDZV_BACKEND",
        "PET_RDZV_ID",
        "PET_RDZV_CONF",
        "PET_MAX_RESTARTS",
        "PET_STANDALONE",
    }
)
# Trainer v2.3's torch plugin sets these; its TrainJob webhook refuses user env of the same name.
TRAINJOB_ENV = frozenset({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"})
# Set by dist-jobs itself on every pod.
OWN_LABELS = frozenset({"app.kubernetes.io/managed-by", "dist-jobs/run"})
SUBMISSION_ANNOTATION = "dist-jobs/submission"
SUBMISSION_ENV = "DIST_JOBS_SUBMISSION"
ANNOTATIONS_MAX_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB


def problems(spec: JobSpec) -> list[Problem]:
    """Every Kubernetes problem of `spec`, in field order."""
    k8s = spec.k8s
    found = _job(spec) + _metadata(k8s) + _pod(spec) + _tolerations(k8s) + _env(spec) + _policy(spec)
    if k8s.api == "trainjob":
        found += _trainjob(spec)
    return found


def _check(field: str, values: Iterable[str], rule: Callable[[str], str], fix: str) -> list[Problem]:
    return [Problem(field, value, why, fix) for value in values if (why := rule(value))]


def _job(spec: JobSpec) -> list[Problem]:
    found = []
    if not spec.image:
        found.append(
            Problem(
                "image", MISSING, "is required for Kubernetes", "set image: registry/project/train:tag (or --image)"
            )
        )
    else:
        found += _check("image", [spec.image], names.image_reference, "write it like registry.example/team/train:1.0")
    if spec.k8s.launch == "direct" and spec.procs > 1:
        found.append(
            Problem(
                "k8s.launch",
                "direct",
                f"runs one python per pod, but procs_per_node is {spec.procs}: the operator's "
                "RANK is the pod rank and WORLD_SIZE counts processes that would not exist",
                "use k8s.launch: torchrun (the default), or procs_per_node: 1",
            )
        )
    if not names.k8s_name(spec):
        found.append(Problem("name", spec.name, "gives no valid Kubernetes name", "use a name with letters, e.g. ddp"))
    if spec.workdir is not None and not posixpath.isabs(spec.workdir):
        found.append(
            Problem("workdir", spec.workdir, "must be absolute in a container", "give the path in the image, e.g. /app")
        )
    if spec.checkpoint_dir.startswith("~"):
        found.append(
            Problem(
                "checkpoint_dir",
                spec.checkpoint_dir,
                "starts with `~`: a pod has no home folder of yours, so it would be a folder named `~` on the volume",
                f"give it relative to k8s.mount_path ({spec.k8s.mount_path}) or as an absolute path in the pod",
            )
        )
    return found


def _metadata(k8s: K8sSpec) -> list[Problem]:
    key_fix = "use [prefix/]name, e.g. team or example.com/team"
    found = _check("k8s.namespace", [k8s.namespace], names.dns1123_label, "use a namespace name such as ml-team")
    found += _check("k8s.labels (key)", k8s.labels, names.qualified_name, key_fix)
    found += _check("k8s.labels (value)", k8s.labels.values(), names.label_value, "use at most 63 of [A-Za-z0-9-_.]")
    found += [
        Problem("k8s.labels (key)", key, "is set by dist-jobs on every job and pod", "choose another label key")
        for key in OWN_LABELS & set(k8s.labels)
    ]
    lowered = [key.lower() for key in k8s.annotations]  # the apiserver checks annotation keys lowercased
    found += _check("k8s.annotations (key)", lowered, names.qualified_name, key_fix)
    if SUBMISSION_ANNOTATION in k8s.annotations:
        found.append(
            Problem(
                "k8s.annotations (key)",
                SUBMISSION_ANNOTATION,
                "is set by `dist-jobs submit`",
                "drop it",
            )
        )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in k8s.annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        found.append(
            Problem("k8s.annotations", f"{size} bytes", "exceed 256 KiB in total", "move large values to a ConfigMap")
        )
    return found


def _pod(spec: JobSpec) -> list[Problem]:
    k8s = spec.k8s
    found = []
    name_fix = "use the object's name as Kubernetes shows it (lowercase letters, digits, '-', '.')"
    for field, value in (("k8s.service_account", k8s.service_account), ("k8s.pvc", k8s.pvc)):
        if value is not None:
            found += _check(field, [value], names.dns1123_subdomain, name_fix)
    found += _check("k8s.image_pull_secrets", k8s.image_pull_secrets, names.dns1123_subdomain, name_fix)
    if k8s.priority_class is not None:
        found += _check("k8s.priority_class", [k8s.priority_class], names.dns1123_subdomain, name_fix)
    if k8s.api == "trainjob":
        found += _check("k8s.runtime", [k8s.runtime], names.dns1123_subdomain, name_fix)
    found += _check("k8s.node_selector (key)", k8s.node_selector, names.qualified_name, "use a node label key")
    found += _check("k8s.node_selector (value)", k8s.node_selector.values(), names.label_value, "use a label value")
    found += _check("k8s.gpu_resource", [k8s.gpu_resource], names.extended_resource, "e.g. nvidia.com/gpu")
    if k8s.pvc is not None and not posixpath.isabs(k8s.mount_path):
        found.append(Problem("k8s.mount_path", k8s.mount_path, "must be an absolute path", "e.g. /shared"))
    if k8s.pvc is not None and k8s.shm_size and posixpath.normpath(k8s.mount_path) == "/dev/shm":
        found.append(
            Problem(
                "k8s.mount_path",
                k8s.mount_path,
                "is where the k8s.shm_size volume is mounted: two volumes at one mountPath are refused",
                "mount the PVC elsewhere (default /shared), or set k8s.shm_size: null",
            )
        )
    return found


def _tolerations(k8s: K8sSpec) -> list[Problem]:
    """pkg/apis/core/validation ValidateTolerations, one problem per rule broken."""
    found = []
    for i, t in enumerate(k8s.tolerations):
        field = f"k8s.tolerations[{i}]"
        if t.key:
            found += _check(f"{field}.key", [t.key], names.qualified_name, "use a taint key such as nvidia.com/gpu")
        elif t.operator != "Exists":
            found.append(
                Problem(f"{field}.operator", t.operator, "must be Exists without a key", "add key:, or Exists")
            )
        if t.operator == "Exists" and t.value:
            found.append(Problem(f"{field}.value", t.value, "must be empty with operator Exists", "drop value:"))
        if t.operator == "Equal":
            found += _check(f"{field}.value", [t.value or ""], names.label_value, "use a taint value")
        if t.tolerationSeconds is not None and t.effect != "NoExecute":
            found.append(
                Problem(
                    f"{field}.effect",
                    t.effect,
                    "must be NoExecute when tolerationSeconds is set",
                    "set effect: NoExecute",
                )
            )
    return found


def _env(spec: JobSpec) -> list[Problem]:
    trainjob = spec.k8s.api == "trainjob"
    owned = TRAINJOB_ENV if trainjob else PYTORCHJOB_ENV
    who = (
        "Kubeflow Trainer's torch runtime sets it and its webhook refuses a TrainJob that sets it too"
        if trainjob
        else "the training operator sets it in every pod, after the spec's env, so its value wins"
    )
    found = [
        Problem(f"env.{name}", spec.env[name], who, "drop it: dist-jobs and torchrun read the operator's value")
        for name in sorted(owned & set(spec.env))
    ]
    if SUBMISSION_ENV in spec.env:
        found.append(Problem(f"env.{SUBMISSION_ENV}", spec.env[SUBMISSION_ENV], "is set by dist-jobs", "drop it"))
    return found


def _policy(spec: JobSpec) -> list[Problem]:
    k8s = spec.k8s
    found = []
    if k8s.restart_policy == "Always":
        found.append(
            Problem(
                "k8s.restart_policy",
                "Always",
                "restarts a pod after every exit, success included: the job never completes",
                "use ExitCode (the default: retries preemptions, not bugs) or OnFailure",
            )
        )
    if k8s.backoff_limit is not None and k8s.restart_policy == "ExitCode" and k8s.api == "pytorchjob":
        found.append(
            Problem(
                "k8s.backoff_limit",
                k8s.backoff_limit,
                "does not cap restarts under restartPolicy ExitCode (training operator v1, kubeflow/trainer#2045): "
                "1 or more never stops a pod that keeps exiting with 128-255, and 0 fails the job on the first "
                "pod failure, a preemption included",
                "drop it: preemption.max_requeues caps the restarts, counted by dist-jobs in the run directory",
            )
        )
    return found


def _trainjob(spec: JobSpec) -> list[Problem]:
    k8s, default = spec.k8s, K8sSpec()
    limit = names.trainjob_name_limit(spec.nodes)
    found = []
    name = names.k8s_name(spec)
    if len(name) > limit:
        found.append(
            Problem(
                "name",
                spec.name,
                f"gives the TrainJob name {name!r} ({len(name)} characters): JobSet names its pods "
                f"<name>-node-0-<index>-<5 random> and refuses names over 63, so a TrainJob of "
                f"{spec.nodes} node(s) may have at most {limit}",
                f"shorten the name to {limit} characters or fewer",
            )
        )
    unsupported = {
        "k8s.priority_class": (k8s.priority_class, "set priorityClassName in the ClusterTrainingRuntime"),
        "k8s.queue": (k8s.queue, "Kueue reads the label kueue.x-k8s.io/queue-name: put it in k8s.labels"),
        "k8s.backoff_limit": (k8s.backoff_limit, "set failurePolicy.maxRestarts in the runtime's JobSet"),
        "k8s.ttl_seconds_after_finished": (k8s.ttl_seconds_after_finished, "set it in the runtime's JobSet"),
        "k8s.min_nodes": (k8s.min_nodes, "the torch runtime is not elastic: use k8s.api: pytorchjob"),
        "k8s.max_nodes": (k8s.max_nodes, "the torch runtime is not elastic: use k8s.api: pytorchjob"),
        "k8s.max_restarts": (k8s.max_restarts, "set failurePolicy.maxRestarts in the runtime's JobSet"),
        "master_port": (spec.master_port, "the torch runtime always uses port 29500"),
        "workdir": (spec.workdir, "set workingDir in the runtime's container, or cd in the command"),
        "k8s.image_pull_policy": (
            None if k8s.image_pull_policy == default.image_pull_policy else k8s.image_pull_policy,
            "set imagePullPolicy in the runtime's container",
        ),
        "k8s.restart_policy": (
            None if k8s.restart_policy == default.restart_policy else k8s.restart_policy,
            "the runtime's JobSet failurePolicy decides restarts",
        ),
    }
    for field, (value, fix) in unsupported.items():
        if value is not None:
            found.append(
                Problem(
                    field, value, "cannot be carried by a TrainJob (Trainer v2.3 runtimePatches)", fix + ", or drop it"
                )
            )
    return found
