"""The job spec: one typed object that every backend renders from.

Field names are the YAML keys of `job.yaml`. Pydantic checks types and ranges; rules that
involve several fields live in `dist_jobs.spec_load.cross_checks` so all problems are reported
together. No torch, no kubernetes here: this module is on `dist-jobs render`'s fast path.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dist_jobs.train.config import TrainConfig


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL character, which no shell or YAML value can carry")
    return value


def _one_line(value: str) -> str:
    _no_nul(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("contains a control character (newline, tab, ...); it lands on an #SBATCH line")
    return value


def _env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
Line = Annotated[str, AfterValidator(_one_line)]
EnvName = Annotated[str, AfterValidator(_env_name)]
# sbatch and Kubernetes both understand these suffixes; Kubernetes gets the binary form.
Memory = Annotated[str, Field(pattern=r"^[0-9]+[KMGT]?$")]
Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NcclSpec(_Section):
    socket_ifname: Line | None = Field(None, description="NCCL_SOCKET_IFNAME, e.g. ib0 or ^lo,docker")
    ib_disable: bool | None = Field(None, description="NCCL_IB_DISABLE=1 when true")
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = Field(None, description="NCCL_DEBUG")


class PreemptionSpec(_Section):
    signal: Literal["USR1", "USR2", "TERM"] = Field(
        "USR1", description="signal the training gets before the time limit or a preemption")
    grace_seconds: int = Field(
        120, ge=30, le=3600, description="seconds before the time limit the signal is sent (SLURM checks every ~30 s)")
    max_requeues: int = Field(3, ge=0, le=100, description="requeues the job may do after a preemption")


class SlurmSpec(_Section):
    partition: Line | None = None
    account: Line | None = None
    qos: Line | None = None
    constraint: Line | None = None
    exclusive: bool = False
    nodelist: Line | None = None
    exclude: Line | None = None
    reservation: Line | None = None
    dependency: Line | None = None
    mail_user: Line | None = None
    mail_type: Line | None = Field(None, description="e.g. END,FAIL")
    array: Line | None = Field(None, description="e.g. 0-9%2")
    gpus_flag: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node", description="how GPUs are requested: --gpus-per-node=G or --gres=gpu:G")
    container: Literal["none", "pyxis", "apptainer"] = Field(
        "none", description="run the command in `image` through pyxis (srun --container-image) or apptainer exec")
    container_mounts: list[Line] = Field(default_factory=list, description="src:dst mounts for the container")
    extra_sbatch: list[Line] = Field(
        default_factory=list, description="raw #SBATCH flags, e.g. '--gres-flags=enforce-binding' (not quoted)")


class Toleration(_Section):
    key: Line | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Line | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class K8sSpec(_Section):
    api: Literal["pytorchjob", "trainjob"] = Field("pytorchjob", description="PyTorchJob (kubeflow.org/v1) or TrainJob (Trainer v2)")
    runtime: Line = Field("torch-distributed", description="TrainJob: the ClusterTrainingRuntime to use")
    launch: Literal["torchrun", "direct"] = Field(
        "torchrun", description="torchrun per pod, or the command directly (one process per pod only)")
    namespace: Line = "default"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[Line] = Field(default_factory=list)
    service_account: Line | None = None
    pvc: Line | None = Field(None, description="ReadWriteMany PVC that holds the shared checkpoint directory")
    mount_path: Line = Field("/shared", description="where the PVC is mounted; a relative checkpoint_dir lands below it")
    shm_size: Quantity | None = Field("8Gi", description="/dev/shm emptyDir (medium Memory) size; null turns it off")
    node_selector: dict[Line, Line] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    priority_class: Line | None = None
    labels: dict[Line, Line] = Field(default_factory=dict)
    annotations: dict[Line, Text] = Field(default_factory=dict)
    restart_policy: Literal["ExitCode", "OnFailure", "Never", "Always"] = Field(
        "ExitCode", description="ExitCode retries only exit codes 128-255 (preemption), not bugs")
    backoff_limit: int | None = Field(None, ge=0, description="default: preemption.max_requeues")
    ttl_seconds_after_finished: int | None = Field(None, ge=0)
    active_deadline_seconds: int | None = Field(None, ge=1)
    gpu_resource: Line = "nvidia.com/gpu"
    cpu_request: Quantity | None = Field(None, description="default: cpus_per_task x procs_per_node")
    memory_request: Quantity | None = Field(None, description="default: memory")
    min_nodes: int | None = Field(None, ge=1, description="elastic: fewest nodes (elasticPolicy when < max_nodes)")
    max_nodes: int | None = Field(None, ge=1, description="elastic: most nodes")
    max_restarts: int | None = Field(None, ge=0, description="elasticPolicy.maxRestarts (gang restarts)")
    queue: Line | None = Field(None, description="runPolicy.schedulingPolicy.queue (Volcano/Kueue)")


class JobSpec(_Section):
    name: Text = Field("dist-job", description="job name; run folder and scheduler names are derived from it")
    command: list[Text] | None = Field(
        None, description="argv to run; default: python3 -m dist_jobs.train with the `train` section")
    train: TrainConfig = Field(default_factory=TrainConfig)
    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(0, ge=0, le=64)
    procs_per_node: int | None = Field(None, ge=1, le=256, description="default: gpus_per_node; required without GPUs")
    cpus_per_task: int = Field(1, ge=1, le=1024)
    memory: Memory | None = Field(None, description="memory per node, e.g. 64G")
    time: Line | None = Field(None, description="time limit: minutes, HH:MM:SS or D-HH:MM:SS")
    env: dict[EnvName, Text] = Field(default_factory=dict)
    setup: list[Text] = Field(default_factory=list, description="raw shell lines run before launch (module load, venv activate)")
    workdir: Line | None = Field(None, description="working directory of the job")
    checkpoint_dir: Text = Field("checkpoints", description="shared checkpoint root (relative: to workdir / the PVC mount)")
    log_dir: Line = Field("logs", description="log folder (relative: to workdir)")
    launcher: Literal["srun", "torchrun"] = Field(
        "srun", description="srun: one task per process; torchrun: one task per node running torchrun")
    master_port: int | None = Field(None, ge=1024, le=65535, description="default: derived from the job id")
    nccl: NcclSpec = Field(default_factory=NcclSpec)
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    image: Line | None = Field(None, description="container image (Kubernetes; SLURM with slurm.container)")
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)
    k8s: K8sSpec = Field(default_factory=K8sSpec)

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


def run_id(name: str) -> str:
    """The name as used for run folders and SLURM: [A-Za-z0-9._-], other runs collapsed to '-'.

    Documented rule: it must be safe as a folder name (no '/', no leading dot) and on an
    #SBATCH line, so it cannot be the raw name.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return safe[:128]
