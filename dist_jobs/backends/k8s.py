"""Kubernetes backend on the official `kubernetes` client (imported only when used).

Creates PyTorchJobs (or TrainJobs) with fieldValidation=Strict: by default the apiserver prunes
an unknown field silently and the Python client never shows the warning. API errors become
messages (k8s_errors). Logs are found by the labels the operator puts on its pods, so a pod
rank means the same thing as the operator's RANK env (Master = 0, Worker i = i + 1; without a
Master, as in elastic jobs, Worker i = i).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import yaml

from dist_jobs.backends.base import JobStatus, Prepared
from dist_jobs.backends.k8s_errors import api_error, no_config, unreachable
from dist_jobs.backends.k8s_ranks import with_ranks
from dist_jobs.errors import BackendError, UsageError
from dist_jobs.render import render
from dist_jobs.spec import JobSpec

APIS = {
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}
MANAGED = "app.kubernetes.io/managed-by=dist-jobs"
PYTORCHJOB_LABEL = "training.kubeflow.org/"
JOBSET_LABEL = "jobset.sigs.k8s.io/"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# The container the logs come from: the operator requires `pytorch`; the torch TrainingRuntime names it `node`.
CONTAINER = {"PyTorchJob": "pytorch", "TrainJob": "node"}
TIMEOUT = (10.0, 120.0)  # (connect, read) seconds: a black-holed apiserver must not hang the CLI


def load_client(kubeconfig: str | None = None, context: str | None = None) -> tuple[Any, str | None]:
    """An ApiClient and its default namespace, from a kubeconfig ($KUBECONFIG, ~/.kube/config) or,
    without one, the in-cluster service account (as kubectl does)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
        return api, _context_namespace(kubeconfig, context)
    except (ConfigException, OSError, TypeError, ValueError) as first:
        if kubeconfig or context:
            raise no_config(kubeconfig, context, first) from None
        try:
            config.load_incluster_config()
        except ConfigException:
            raise no_config(None, None, None) from None
        return client.ApiClient(), _incluster_namespace()


def _context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    from kubernetes import config

    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return ((chosen or {}).get("context") or {}).get("namespace")


def _incluster_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


class K8sBackend:
    name = "k8s"

    def __init__(
        self,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        api_client: Any = None,
        kind: str = "PyTorchJob",
        timeout: tuple[float, float] = TIMEOUT,
    ) -> None:
        if kind not in APIS:
            raise UsageError(f"unknown Kubernetes job kind {kind!r}", f"use one of {', '.join(APIS)}")
        self.namespace = namespace
        self._context, self._kubeconfig = context, kubeconfig
        self._client = api_client
        self._client_namespace: str | None = None
        self.kind = kind
        self.timeout = timeout

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client, self._client_namespace = load_client(self._kubeconfig, self._context)
        return self._client

    def _ns(self) -> str:
        """--namespace, else the kubeconfig context's namespace, else `default` (kubectl's order)."""
        if self.namespace:
            return self.namespace
        _ = self.client  # loading the kubeconfig is what tells the context's namespace
        return self._client_namespace or "default"

    def namespace_in_use(self) -> str:  # what a job handle (k8s://NS/KIND/NAME) records
        return self._ns()

    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client)

    @contextlib.contextmanager
    def _translated(self, what: str, kind: str | None = None) -> Iterator[None]:
        """ApiException -> its message and a hint; a socket-level failure -> 'cannot reach'."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as exc:
            raise api_error(exc, what, kind or self.kind) from None
        except (HTTPError, OSError) as exc:
            raise unreachable(self.client.configuration.host, exc) from None

    def _call(self, what: str, fn: Any, *args: Any, kind: str | None = None, **kwargs: Any) -> Any:
        with self._translated(what, kind):
            return fn(*args, _request_timeout=self.timeout, **kwargs)

    def prepare(self, spec: JobSpec) -> Prepared:
        suffix = "trainjob" if spec.k8s.api == "trainjob" else "pytorchjob"
        return Prepared("k8s", spec, render(spec, "k8s"), f"{spec.run_id}.{suffix}.yaml")

    def _create(self, prepared: Prepared, dry_run: bool) -> dict[str, Any]:
        body = yaml.safe_load(prepared.payload)
        kind = body["kind"]  # the manifest decides: a TrainJob spec goes to trainjobs whatever self.kind is
        group, version, plural = APIS[kind]
        namespace = body["metadata"].get("namespace") or self._ns()
        extra = {"dry_run": "All"} if dry_run else {}
        return self._call(
            f"create {kind} {namespace}/{body['metadata']['name']}",
            self._custom().create_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            body,
            kind=kind,
            field_validation="Strict",
            **extra,
        )

    def submit(self, prepared: Prepared) -> str:
        created = self._create(prepared, dry_run=False)
        return str(created["metadata"]["name"])

    def server_dry_run(self, prepared: Prepared) -> str:
        if self._client is None and not (self._kubeconfig or self._context):
            try:
                _ = self.client  # builds the client: raises when no cluster is configured
            except BackendError as exc:  # no cluster configured: the rendered manifest is the dry run
                return f"skipped ({exc.message})"
        self._create(prepared, dry_run=True)
        return "accepted by the apiserver (dryRun=All, fieldValidation=Strict); nothing was created"

    def _get(self, name: str) -> dict[str, Any]:
        group, version, plural = APIS[self.kind]
        return self._call(
            f"get {self.kind} {self._ns()}/{name}",
            self._custom().get_namespaced_custom_object,
            group,
            version,
            self._ns(),
            plural,
            name,
        )

    def status(self, job_id: str) -> JobStatus:
        obj = self._get(job_id)
        return with_ranks(job_status(obj), self._pods(job_id), self.kind, _has_master(obj))

    def _pods(self, job: str) -> list[dict[str, Any]]:
        from kubernetes import client

        core = client.CoreV1Api(self.client)
        label = f"{JOBSET_LABEL}jobset-name" if self.kind == "TrainJob" else f"{PYTORCHJOB_LABEL}job-name"
        found = self._call(f"list pods of {job}", core.list_namespaced_pod, self._ns(), label_selector=f"{label}={job}")
        return [self.client.sanitize_for_serialization(p) for p in found.items]

    def list(self) -> list[JobStatus]:
        group, version, plural = APIS[self.kind]
        found = self._call(
            f"list {plural}.{group} in {self._ns()}",
            self._custom().list_namespaced_custom_object,
            group,
            version,
            self._ns(),
            plural,
            label_selector=MANAGED,
        )
        return [job_status(item) for item in found.get("items", [])]

    def cancel(self, job_id: str) -> None:
        # Foreground: the job stays (Terminating) until its pods are gone, so a resubmit under the
        # same name cannot meet the old run's pods.
        group, version, plural = APIS[self.kind]
        self._call(
            f"delete {self.kind} {self._ns()}/{job_id}",
            self._custom().delete_namespaced_custom_object,
            group,
            version,
            self._ns(),
            plural,
            job_id,
            propagation_policy="Foreground",
        )

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of the pod with pod rank `rank` (default 0); follow=True streams until the container ends."""
        from kubernetes import client, watch

        rank = 0 if rank is None else rank
        if rank < 0:
            raise UsageError(f"--rank {rank}: a pod rank is 0 or more", "rank 0 is the master pod")
        core = client.CoreV1Api(self.client)
        pod, container = self._pod_for_rank(core, job_id, rank)
        what = f"logs of pod {self._ns()}/{pod}"
        if follow:  # Watch.stream turns the chunked follow=true response into lines as they arrive
            with self._translated(what):
                yield from watch.Watch().stream(core.read_namespaced_pod_log, pod, self._ns(), container=container)
            return
        text = self._call(what, core.read_namespaced_pod_log, pod, self._ns(), container=container)
        yield from (text or "").splitlines()  # the client returns None, not "", for an empty log

    def _pod_for_rank(self, core: Any, job: str, rank: int) -> tuple[str, str]:
        """(pod name, container) of `rank`, selected by the operator's (or JobSet's) pod labels."""
        if self.kind == "TrainJob":
            selector = f"{JOBSET_LABEL}jobset-name={job},{JOBSET_LABEL}replicatedjob-name=node"
            index = str(rank)  # the torch runtime's PET_NODE_RANK is the Indexed Job's completion index
        else:
            selector = pytorchjob_selector(job, rank, has_master=_has_master(self._get(job)))
            index = None
        pods = self._call(f"list pods of {job}", core.list_namespaced_pod, self._ns(), label_selector=selector).items
        if index is not None:
            pods = [p for p in pods if _completion_index(p.metadata) == index]
        if not pods:
            raise self._no_pod(core, job, rank)
        # a restarted pod can briefly coexist with its terminating predecessor: take the live, newest one
        pod = max(pods, key=lambda p: (p.metadata.deletion_timestamp is None, str(p.metadata.creation_timestamp)))
        return pod.metadata.name, _container(pod, CONTAINER[self.kind])

    def _no_pod(self, core: Any, job: str, rank: int) -> BackendError:
        label = f"{JOBSET_LABEL}jobset-name" if self.kind == "TrainJob" else f"{PYTORCHJOB_LABEL}job-name"
        found = self._call(f"list pods of {job}", core.list_namespaced_pod, self._ns(), label_selector=f"{label}={job}")
        names = sorted(p.metadata.name for p in found.items)
        return BackendError(
            f"{self.kind} {self._ns()}/{job} has no pod with rank {rank} (its pods: {', '.join(names) or 'none yet'})",
            f"ranks run from 0 to the number of pods - 1; pods appear once the job is scheduled: "
            f"dist-jobs status --backend k8s {job}",
        )


def pytorchjob_selector(job: str, rank: int, has_master: bool) -> str:
    """Label selector of the PyTorchJob pod whose operator-given RANK (PET_NODE_RANK) is `rank`."""
    if has_master and rank == 0:
        rtype, index = "master", 0
    else:
        rtype, index = "worker", rank - 1 if has_master else rank
    return (
        f"{PYTORCHJOB_LABEL}job-name={job},{PYTORCHJOB_LABEL}replica-type={rtype},"
        f"{PYTORCHJOB_LABEL}replica-index={index}"
    )


def _has_master(job: dict[str, Any]) -> bool:
    # The job's spec, not the pods present: a missing master pod must not shift every rank by one.
    return "Master" in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {})


def _completion_index(meta: Any) -> str | None:
    for source in (meta.annotations, meta.labels):  # the label only exists on newer clusters
        if source and COMPLETION_INDEX in source:
            return str(source[COMPLETION_INDEX])
    return None


def _container(pod: Any, preferred: str) -> str:
    names = [c.name for c in (pod.spec.containers if pod.spec else None) or []]
    return preferred if preferred in names or not names else names[0]


def job_status(obj: dict[str, Any]) -> JobStatus:
    """Latest true condition as the state; per-replica (or per-Job) pod counts as extras."""
    meta, status = obj["metadata"], obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    latest = conditions[-1] if conditions else {}
    state, detail = latest.get("type", "Pending"), latest.get("message", "")
    if meta.get("deletionTimestamp"):
        state, detail = "Terminating", f"deleted at {meta['deletionTimestamp']}; its pods are being removed"
    counts = dict(status.get("replicaStatuses") or {})  # PyTorchJob: {Master: {active: 1}, ...}
    counts.update({j.get("name", "?"): j for j in status.get("jobsStatus") or []})  # TrainJob: [{name, active}]
    extra = {name: _counts(c) for name, c in counts.items() if isinstance(c, dict)}
    return JobStatus(meta["name"], meta["name"], state, detail, extra)


def _counts(counts: dict[str, Any]) -> str:
    # replicaStatuses also carries label selectors: keep the pod counts only
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()) if isinstance(v, int) and not isinstance(v, bool))
