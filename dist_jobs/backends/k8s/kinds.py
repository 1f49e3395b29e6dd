"""The two kinds of job the Kubernetes backend creates and reads: Kubeflow's PyTorchJob (training
operator v1) and TrainJob (Trainer v2). Each class owns what differs between them, and the backend,
status, logs and errors ask it: the API path, what installs the CRD, the labels of the job's pods,
a pod's rank, the container the logs come from, the job's environment and its pod templates.

A pod's rank is what the operator gave it: PyTorchJob master = 0, worker i = i + 1 (i without a
master, as in elastic jobs); a TrainJob's node pod is its Indexed Job's completion index.
Pure: dicts as the apiserver returns them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

OPERATOR_LABEL = "training.kubeflow.org/"
JOBSET_LABEL = "jobset.sigs.k8s.io/"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


class JobKind(ABC):
    name: ClassVar[str]  # the object's kind, as in its manifest
    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    container: ClassVar[str]  # the container a pod's log comes from
    install: ClassVar[str]  # the hint when the cluster does not serve this kind

    @property
    def crd(self) -> str:
        """`plural.group/version`, as an error names the resource."""
        return f"{self.plural}.{self.group}/{self.version}"

    def path(self, namespace: str, name: str = "") -> str:
        """The REST path of the kind's objects in `namespace`, or of the one named `name`."""
        return f"/apis/{self.group}/{self.version}/namespaces/{namespace}/{self.plural}" + (f"/{name}" if name else "")

    @abstractmethod
    def pods_of(self, job: str) -> str:
        """The label selector of every pod of `job`."""

    @abstractmethod
    def rank_of(self, pod: dict[str, Any], job: dict[str, Any]) -> int | None:
        """The pod's rank among the pods of `job` (the object), None when its labels do not say."""

    @abstractmethod
    def rank_selector(self, name: str, rank: int, job: dict[str, Any]) -> str:
        """A label selector that narrows the pods of `name` to those of pod rank `rank`."""

    @abstractmethod
    def env(self, job: dict[str, Any]) -> list[Any]:
        """The env list of the job's training container."""

    @abstractmethod
    def templates(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The pod templates of a job's manifest (each pod is made from one)."""


class PyTorchJob(JobKind):
    name = "PyTorchJob"
    group, version, plural = "kubeflow.org", "v1", "pytorchjobs"
    container = "pytorch"  # the operator requires this name
    install = (
        "install the Kubeflow training operator v1 (its manifests include the CRD); a test cluster can take the "
        "vendored CRD: kubectl apply -f kubeflow.org_pytorchjobs.yaml from dist_jobs/crds/ (k8s/crds/ in a checkout)"
    )

    def pods_of(self, job: str) -> str:
        return f"{OPERATOR_LABEL}job-name={job}"

    def rank_of(self, pod: dict[str, Any], job: dict[str, Any]) -> int | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        index = labels.get(f"{OPERATOR_LABEL}replica-index")
        if not str(index).isdigit():
            return None
        if labels.get(f"{OPERATOR_LABEL}replica-type") == "master":
            return 0
        return int(str(index)) + (1 if has_master(job) else 0)

    def rank_selector(self, name: str, rank: int, job: dict[str, Any]) -> str:
        """The pod whose operator-given RANK (PET_NODE_RANK) is `rank`."""
        if has_master(job) and rank == 0:
            rtype, index = "master", 0
        else:
            rtype, index = "worker", rank - 1 if has_master(job) else rank
        return f"{self.pods_of(name)},{OPERATOR_LABEL}replica-type={rtype},{OPERATOR_LABEL}replica-index={index}"

    def env(self, job: dict[str, Any]) -> list[Any]:
        for template in self.templates(job):
            for container in (template.get("spec") or {}).get("containers") or []:
                return list(container.get("env") or [])
        return []

    def templates(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        replicas = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
        return [replica.get("template") or {} for replica in replicas]


class TrainJob(JobKind):
    name = "TrainJob"
    group, version, plural = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
    container = "node"  # the torch TrainingRuntime's
    install = (
        "install Kubeflow Trainer v2 (its manifests include the CRD and the torch-distributed runtime), "
        "or render a PyTorchJob instead (k8s.api: pytorchjob)"
    )

    def pods_of(self, job: str) -> str:
        return f"{JOBSET_LABEL}jobset-name={job}"

    def rank_of(self, pod: dict[str, Any], job: dict[str, Any]) -> int | None:
        index = completion_index(pod)
        return int(index) if index is not None and index.isdigit() else None

    def rank_selector(self, name: str, rank: int, job: dict[str, Any]) -> str:
        # The completion index is an annotation on older clusters: the caller picks by rank_of.
        return f"{self.pods_of(name)},{JOBSET_LABEL}replicatedjob-name=node"

    def env(self, job: dict[str, Any]) -> list[Any]:
        return list(((job.get("spec") or {}).get("trainer") or {}).get("env") or [])

    def templates(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        found = []
        for patch in (job.get("spec") or {}).get("runtimePatches") or []:
            runtime = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
            for step in runtime.get("replicatedJobs") or []:
                found.append(((step.get("template") or {}).get("spec") or {}).get("template") or {})
        return found


KINDS: dict[str, JobKind] = {kind.name: kind for kind in (PyTorchJob(), TrainJob())}


def has_master(job: dict[str, Any]) -> bool:
    # The job's spec, not the pods present: a missing master pod must not shift every rank by one.
    return "Master" in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {})


def completion_index(pod: dict[str, Any]) -> str | None:
    """A TrainJob pod's Indexed Job completion index, or None."""
    meta = pod.get("metadata") or {}
    for source in (meta.get("annotations"), meta.get("labels")):  # the label only exists on newer clusters
        if source and COMPLETION_INDEX in source:
            return str(source[COMPLETION_INDEX])
    return None
