"""The job spec: one typed object that every backend renders from.

Field names are the YAML keys of `job.yaml`. msgspec checks types and ranges (through
`dist_jobs.spec.validate`, which reports every problem at once); rules that involve several fields
live in `dist_jobs.spec.load.cross_checks`. Build specs with `dist_jobs.spec.load.load_spec`:
constructing a class here directly checks nothing. No torch, no kubernetes here: this module
is on `dist-jobs render`'s fast path.
"""

import hashlib
import re
from typing import Annotated, Any, Literal

import msgspec.json
from msgspec import Meta, Struct, field

from dist_jobs.spec.train import TrainConfig
from dist_jobs.spec.validate import END, Text, checked

ShellLine = Annotated[
    str,
    checked(
        r"^[^\x00\r\ud800-\udfff]*" + END,
        "contains a NUL, a carriage return or bytes that are not UTF-8: the line is raw shell, and "
        "sbatch refuses a script with CR LF",
        "remove the carriage return (the file may have Windows line ends: dos2unix)",
    ),
]
Line = Annotated[
    str,
    checked(
        r"^[^\x00-\x1f\x7f\ud800-\udfff]*" + END,
        "contains a control character (newline, tab, ...) or bytes that are not UTF-8; it lands on an #SBATCH line",
        "put the value on one line of UTF-8 text without control characters",
    ),
]
EnvName = Annotated[
    str,
    checked(
        r"^[A-Za-z_][A-Za-z0-9_]*" + END,
        "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        "rename it, e.g. MY_VAR",
    ),
]
# sbatch and Kubernetes both understand these suffixes; Kubernetes gets the binary form.
Memory = Annotated[str, checked(r"^[0-9]+[KMGT]?" + END, "is not a memory size", "write it like 64G or 512M")]
Quantity = Annotated[
    str,
    checked(
        r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?" + END,
        "is not a Kubernetes quantity",
        "write it like 8Gi, 500m or 4",
    ),
]


def doc(text: str) -> Meta:
    return Meta(description=text)


class _Section(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class NcclSpec(_Section, frozen=True):
    socket_ifname: Annotated[Line | None, doc("NCCL_SOCKET_IFNAME, e.g. ib0 or ^lo,docker")] = None
    ib_disable: Annotated[bool | None, doc("NCCL_IB_DISABLE=1 when true")] = None
    debug: Annotated[Literal["VERSION", "WARN", "INFO", "TRACE"] | None, doc("NCCL_DEBUG")] = None


class PreemptionSpec(_Section, frozen=True):
    signal: Annotated[
        Literal["USR1", "USR2", "TERM"], doc("signal the training gets before the time limit or a preemption")
    ] = "USR1"
    grace_seconds: Annotated[
        int,
        Meta(
            ge=30, le=3600, description=("seconds before the time limit the signal is sent (SLURM checks every ~30 s)")
        ),
    ] = 120
    max_requeues: Annotated[int, Meta(ge=0, le=100, description="requeues the job may do after a preemption")] = 3
    max_restarts: Annotated[
        int,
        Meta(
            ge=0,
            le=100,
            description=(
                "restarts in place per allocation after a fault that leaves every node answering (a rank "
                "killed by a signal nobody sent, a lost peer, a hang), before the allocation is given up; "
                "on Kubernetes, a pod's recreations on one node before a rank killed there keeps the node away"
            ),
        ),
    ] = 3


class SlurmSpec(_Section, frozen=True):
    partition: Annotated[Line | None, doc("sbatch --partition, e.g. gpu")] = None
    account: Annotated[Line | None, doc("sbatch --account: the account the job's usage is charged to")] = None
    qos: Annotated[Line | None, doc("sbatch --qos: quality of service, e.g. high")] = None
    constraint: Annotated[Line | None, doc("sbatch --constraint: node features, e.g. a100|h100")] = None
    exclusive: Annotated[bool, doc("sbatch --exclusive: no other job shares the job's nodes")] = False
    nodelist: Annotated[Line | None, doc("sbatch --nodelist: nodes the job must run on, e.g. node[01-04]")] = None
    exclude: Annotated[Line | None, doc("sbatch --exclude: nodes the job must not run on")] = None
    reservation: Annotated[Line | None, doc("sbatch --reservation: run inside this reservation")] = None
    dependency: Annotated[Line | None, doc("sbatch --dependency, e.g. afterok:12345")] = None
    mail_user: Annotated[Line | None, doc("sbatch --mail-user: who gets the mail_type notices")] = None
    mail_type: Annotated[Line | None, doc("sbatch --mail-type: when to mail, e.g. END,FAIL")] = None
    array: Annotated[Line | None, doc("sbatch --array: a job array's task ids, e.g. 0-9%2")] = None
    gpus_flag: Annotated[
        Literal["gpus-per-node", "gres"], doc("how GPUs are requested: --gpus-per-node=G or --gres=gpu:G")
    ] = "gpus-per-node"
    container: Annotated[
        Literal["none", "pyxis", "apptainer"],
        doc("run the command in `image` through pyxis (srun --container-image) or apptainer exec"),
    ] = "none"
    container_mounts: Annotated[list[Line], doc("src:dst mounts for the container")] = field(default_factory=list)
    extra_sbatch: Annotated[list[Line], doc("raw #SBATCH flags, e.g. '--gres-flags=enforce-binding' (not quoted)")] = (
        field(default_factory=list)
    )


class Toleration(_Section, frozen=True):
    """A pod toleration (Kubernetes' own fields): lets the pods onto nodes with a matching taint."""

    key: Annotated[Line | None, doc("the taint's key; null with Exists: every taint")] = None
    operator: Annotated[
        Literal["Exists", "Equal"], doc("Equal: the taint's value must be `value`; Exists: any value")
    ] = "Equal"
    value: Annotated[Line | None, doc("the taint's value (operator Equal)")] = None
    effect: Annotated[
        Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None, doc("the taint effect it matches; null: all")
    ] = None
    tolerationSeconds: Annotated[
        int | None, doc("NoExecute: seconds the pod stays on the node after the taint appears; null: for good")
    ] = None


NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]


class K8sSpec(_Section, frozen=True):
    api: Annotated[Literal["pytorchjob", "trainjob"], doc("PyTorchJob (kubeflow.org/v1) or TrainJob (Trainer v2)")] = (
        "pytorchjob"
    )
    runtime: Annotated[Line, doc("TrainJob: the ClusterTrainingRuntime to use")] = "torch-distributed"
    launch: Annotated[
        Literal["torchrun", "direct"], doc("torchrun per pod, or the command directly (one process per pod only)")
    ] = "torchrun"
    namespace: Annotated[Line, doc("namespace of the job, its pods and its snapshot ConfigMap")] = "default"
    image_pull_policy: Annotated[Literal["Always", "IfNotPresent", "Never"], doc("the container's imagePullPolicy")] = (
        "IfNotPresent"
    )
    image_pull_secrets: Annotated[
        list[Line], doc("names of Secrets in the namespace that hold registry credentials (imagePullSecrets)")
    ] = field(default_factory=list)
    service_account: Annotated[
        Line | None, doc("the pods' serviceAccountName (default: one made for the job, see avoid_failed_nodes)")
    ] = None
    avoid_failed_nodes: Annotated[
        bool,
        doc(
            "PyTorchJob: a pod whose rank was killed on a node patches the job so that its recreated pods avoid "
            "that node (node affinity); needs a Role and RoleBinding, made with the job. false: neither"
        ),
    ] = True
    pvc: Annotated[Line | None, doc("ReadWriteMany PVC that holds the shared checkpoint directory")] = None
    mount_path: Annotated[Line, doc("where the PVC is mounted; a relative checkpoint_dir lands below it")] = "/shared"
    shm_size: Annotated[Quantity | None, doc("/dev/shm emptyDir (medium Memory) size; null turns it off")] = "8Gi"
    node_selector: Annotated[
        dict[Line, Line], doc("node labels the pods must run on (nodeSelector), e.g. {gpu: a100}")
    ] = field(default_factory=dict)
    tolerations: Annotated[list[Toleration], doc("the pods' tolerations (see `Toleration` below)")] = field(
        default_factory=list
    )
    priority_class: Annotated[
        Line | None,
        doc("PriorityClass of the pods (priorityClassName) and, in a PyTorchJob, of its gang (schedulingPolicy)"),
    ] = None
    labels: Annotated[dict[Line, Line], doc("extra labels on the job and its pods")] = field(default_factory=dict)
    annotations: Annotated[dict[Line, Text], doc("annotations on the job and its pods")] = field(default_factory=dict)
    restart_policy: Annotated[
        Literal["ExitCode", "OnFailure", "Never", "Always"],
        doc("ExitCode retries only exit codes 128-255 (preemption), not bugs"),
    ] = "ExitCode"
    backoff_limit: Annotated[
        NonNegative | None,
        doc(
            "OnFailure/Never only (default: preemption.max_requeues); under ExitCode the operator counts no "
            "restarts, the pod entrypoint caps them at preemption.max_requeues"
        ),
    ] = None
    ttl_seconds_after_finished: Annotated[
        NonNegative | None, doc("PyTorchJob: the operator deletes the finished job after this many seconds")
    ] = None
    active_deadline_seconds: Annotated[
        Positive | None, doc("the job fails once it has run this many seconds (activeDeadlineSeconds)")
    ] = None
    gpu_resource: Annotated[Line, doc("resource name of a GPU in the pods' limits, e.g. amd.com/gpu")] = (
        "nvidia.com/gpu"
    )
    cpu_request: Annotated[Quantity | None, doc("default: cpus_per_task x procs_per_node")] = None
    memory_request: Annotated[Quantity | None, doc("default: memory")] = None
    min_nodes: Annotated[Positive | None, doc("elastic: fewest nodes (elasticPolicy when < max_nodes)")] = None
    max_nodes: Annotated[Positive | None, doc("elastic: most nodes")] = None
    max_restarts: Annotated[NonNegative | None, doc("elasticPolicy.maxRestarts (gang restarts)")] = None
    queue: Annotated[
        Line | None,
        doc("runPolicy.schedulingPolicy.queue (Volcano); Kueue reads the label kueue.x-k8s.io/queue-name instead"),
    ] = None


class JobSpec(_Section, frozen=True):
    name: Annotated[Text, doc("job name; run folder and scheduler names are derived from it")] = "dist-job"
    command: Annotated[
        list[Text] | None, doc("argv to run; default: python3 -m dist_jobs.train with the `train` section")
    ] = None
    train: Annotated[
        TrainConfig,
        doc(
            "the built-in trainer's settings (see `train:` below), run when `command` is not set; its "
            "collective_timeout and hang_min_seconds set every job's DIST_JOBS_COLLECTIVE_TIMEOUT"
        ),
    ] = field(default_factory=TrainConfig)
    nodes: Annotated[
        int, Meta(ge=1, le=4096, description="machines (SLURM nodes, Kubernetes pods) the job runs on")
    ] = 1
    gpus_per_node: Annotated[int, Meta(ge=0, le=64, description="GPUs requested on each node; 0: a CPU job (gloo)")] = 0
    procs_per_node: Annotated[
        Annotated[int, Meta(ge=1, le=256)] | None, doc("default: gpus_per_node; required without GPUs")
    ] = None
    cpus_per_task: Annotated[
        int,
        Meta(
            ge=1,
            le=1024,
            description="CPU cores for each process (sbatch --cpus-per-task per srun task; on Kubernetes the "
            "default cpu request is this x procs_per_node)",
        ),
    ] = 1
    memory: Annotated[Memory | None, doc("memory per node, e.g. 64G")] = None
    # A bare number is minutes, as SLURM reads `--time=10`; YAML gives `time: 10` as a number.
    time: Annotated[
        Line | Annotated[int, Meta(ge=0)] | None,
        doc("time limit: minutes (a bare number: 90), HH:MM:SS, D-HH or D-HH:MM:SS (as SLURM reads them)"),
    ] = None
    env: Annotated[
        dict[EnvName, Text],
        doc("environment variables of every process, e.g. {OMP_NUM_THREADS: '4'}; they win over dist-jobs' own"),
    ] = field(default_factory=dict)
    setup: Annotated[list[ShellLine], doc("raw shell lines run before launch (module load, venv activate)")] = field(
        default_factory=list
    )
    workdir: Annotated[Line | None, doc("working directory of the job")] = None
    snapshot: Annotated[
        bool | None,
        doc(
            "run a copy of the code as it is at submit (git-tracked and untracked unignored files, uncommitted "
            "changes included) on every attempt: SLURM and local from the job's own folder, Kubernetes from a "
            "ConfigMap the job owns (at most 1 MiB compressed); default: on for SLURM and local sweeps"
        ),
    ] = None
    checkpoint_dir: Annotated[Text, doc("shared checkpoint root (relative: to workdir / the PVC mount)")] = (
        "checkpoints"
    )
    log_dir: Annotated[Line, doc("log folder (relative: to workdir)")] = "logs"
    launcher: Annotated[
        Literal["srun", "torchrun"], doc("srun: one task per process; torchrun: one task per node running torchrun")
    ] = "srun"
    master_port: Annotated[Annotated[int, Meta(ge=1024, le=65535)] | None, doc("default: derived from the job id")] = (
        None
    )
    nccl: Annotated[NcclSpec, doc("NCCL environment variables (see `nccl:` below)")] = field(default_factory=NcclSpec)
    preemption: Annotated[
        PreemptionSpec, doc("the warning signal before the time limit and the requeue cap (see `preemption:` below)")
    ] = field(default_factory=PreemptionSpec)
    image: Annotated[Line | None, doc("container image (Kubernetes; SLURM with slurm.container)")] = None
    python: Annotated[
        Line | None,
        doc(
            "the job's Python on SLURM: default, the interpreter running `dist-jobs submit` (passed as "
            "DIST_JOBS_PYTHON), else python3 on the nodes' PATH; in a container, python3 of the image"
        ),
    ] = None
    slurm: Annotated[SlurmSpec, doc("SLURM's own settings (see `slurm:` below)")] = field(default_factory=SlurmSpec)
    k8s: Annotated[K8sSpec, doc("Kubernetes' own settings (see `k8s:` below)")] = field(default_factory=K8sSpec)

    @property
    def procs(self) -> int:
        """Processes per node actually launched (not GPUs present)."""
        return self.procs_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs

    @property
    def argv(self) -> list[str]:
        if self.command:
            return list(self.command)
        return ["python3", "-m", "dist_jobs.train", *self.train.to_argv()]

    @property
    def run_id(self) -> str:
        return run_id(self.name)


RUN_ID_MAX = 128  # SLURM job names and run folders; long enough to read, far below NAME_MAX
_HASH_LEN = 10
_HASHED = re.compile(rf"-[0-9a-f]{{{_HASH_LEN}}}$")


def run_id(name: str) -> str:
    """The name as used for run folders and SLURM job names, distinct for distinct names.

    Documented rule: a name of [A-Za-z0-9._-] that neither starts nor ends with '-' or '.' and
    has at most 128 characters is used as it is. Any other name becomes its [A-Za-z0-9._-] form
    (other runs collapsed to '-'), cut, plus '-' and a 10-hex-digit hash of the whole name; so is
    a name that already ends like such a hash, so a kept name never equals a hashed one. Two
    names share a run folder only if they are equal (or their SHA-256 prefixes collide).
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return hashed_name(name, safe, RUN_ID_MAX, ".-")


def hashed_name(name: str, safe: str, max_len: int, strip: str) -> str:
    """`name` itself when it is already `safe` and short enough, else `safe` cut + '-' + hash of `name`."""
    if not safe:
        return ""
    if safe == name and len(name) <= max_len and not _HASHED.search(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]
    return safe[: max_len - _HASH_LEN - 1].rstrip(strip) + "-" + digest


def json_schema() -> dict[str, Any]:
    """The JSON Schema of job.yaml (2020-12), JobSpec at the top so editors complete its keys."""
    generated = msgspec.json.schema(JobSpec)
    defs = generated["$defs"]
    schema: dict[str, Any] = defs.pop("JobSpec")
    schema.update(
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, "title": "dist-jobs job spec"}
    )
    return schema
