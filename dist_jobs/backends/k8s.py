"""Kubernetes backend on the official `kubernetes` client (imported only when used).

Creates PyTorchJobs (or TrainJobs) with fieldValidation=Strict: by default the apiserver prunes
an unknown field silently and the Python client never shows the warning. API errors become
messages: 409 exists, 422 with every field cause, 403 webhook denial, 404 CRD missing (a plain
text body), server unreachable.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import yaml

from dist_jobs.backends.base import JobStatus, Prepared
from dist_jobs.backends.k8s_errors import api_error, unreachable
from dist_jobs.errors import BackendError
from dist_jobs.render import render
from dist_jobs.spec import JobSpec

APIS = {
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}
MANAGED = "app.kubernetes.io/managed-by=dist-jobs"


def load_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ApiClient from a kubeconfig ($KUBECONFIG, ~/.kube/config) or the in-cluster service account."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, FileNotFoundError, TypeError) as first:
        if kubeconfig or context:
            raise BackendError(f"cannot load kubeconfig {kubeconfig or '(default)'} context {context or '(current)'}: "
                               f"{first}", "check --kubeconfig/--context, or `kubectl config get-contexts`") from None
        try:
            config.load_incluster_config()
        except ConfigException:
            raise BackendError("no Kubernetes configuration: no kubeconfig and not running in a pod",
                               "set KUBECONFIG or pass --kubeconfig (the test apiserver: k8s/apiserver/up.sh "
                               "prints its path)") from None
        return client.ApiClient()


class K8sBackend:
    name = "k8s"

    def __init__(self, namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None,
                 api_client: Any = None, kind: str = "PyTorchJob") -> None:
        self.namespace = namespace
        self._context, self._kubeconfig = context, kubeconfig
        self._client = api_client
        self.kind = kind

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = load_client(self._kubeconfig, self._context)
        return self._client

    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise api_error(exc, what) from None
        except (HTTPError, OSError) as exc:
            raise unreachable(self.client.configuration.host, exc) from None

    def prepare(self, spec: JobSpec) -> Prepared:
        suffix = "trainjob" if spec.k8s.api == "trainjob" else "pytorchjob"
        return Prepared("k8s", spec, render(spec, "k8s"), f"{spec.run_id}.{suffix}.yaml")

    def _create(self, prepared: Prepared, dry_run: bool) -> dict[str, Any]:
        body = yaml.safe_load(prepared.payload)
        group, version, plural = APIS[body["kind"]]
        namespace = body["metadata"]["namespace"]
        extra = {"dry_run": "All"} if dry_run else {}
        return self._call(f"create {body['kind']} {namespace}/{body['metadata']['name']}",
                          self._custom().create_namespaced_custom_object, group, version, namespace, plural, body,
                          field_validation="Strict", **extra)

    def submit(self, prepared: Prepared) -> str:
        created = self._create(prepared, dry_run=False)
        return str(created["metadata"]["name"])

    def server_dry_run(self, prepared: Prepared) -> str:
        self._create(prepared, dry_run=True)
        return "accepted by the apiserver (dryRun=All, fieldValidation=Strict)"

    def _ns(self) -> str:
        return self.namespace or "default"

    def _get(self, name: str) -> dict[str, Any]:
        group, version, plural = APIS[self.kind]
        return self._call(f"get {self.kind} {self._ns()}/{name}", self._custom().get_namespaced_custom_object,
                          group, version, self._ns(), plural, name)

    def status(self, job_id: str) -> JobStatus:
        return job_status(self._get(job_id))

    def list(self) -> list[JobStatus]:
        group, version, plural = APIS[self.kind]
        found = self._call(f"list {plural} in {self._ns()}", self._custom().list_namespaced_custom_object,
                           group, version, self._ns(), plural, label_selector=MANAGED)
        return [job_status(item) for item in found.get("items", [])]

    def cancel(self, job_id: str) -> None:
        group, version, plural = APIS[self.kind]
        self._call(f"delete {self.kind} {self._ns()}/{job_id}", self._custom().delete_namespaced_custom_object,
                   group, version, self._ns(), plural, job_id, propagation_policy="Foreground")

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Logs of the pod with pod rank `rank` (0 = master), found by the operator's labels."""
        from kubernetes import client

        core = client.CoreV1Api(self.client)
        pod = self._pod_for_rank(core, job_id, rank or 0)
        if follow:
            from kubernetes import watch

            yield from watch.Watch().stream(core.read_namespaced_pod_log, pod, self._ns(), container="pytorch")
            return
        text = self._call(f"logs of pod {pod}", core.read_namespaced_pod_log, pod, self._ns(), container="pytorch")
        yield from str(text).splitlines()

    def _pod_for_rank(self, core: Any, job: str, rank: int) -> str:
        selector = f"training.kubeflow.org/job-name={job}"
        pods = self._call(f"list pods of {job}", core.list_namespaced_pod, self._ns(), label_selector=selector)
        by_rank: dict[int, str] = {}
        items = pods.items if hasattr(pods, "items") else pods.get("items", [])
        for pod in items:
            meta = pod.metadata if hasattr(pod, "metadata") else pod["metadata"]
            labels = (meta.labels if hasattr(meta, "labels") else meta.get("labels")) or {}
            name = meta.name if hasattr(meta, "name") else meta["name"]
            index = int(labels.get("training.kubeflow.org/replica-index", "0"))
            is_master = labels.get("training.kubeflow.org/replica-type", "").lower() == "master"
            by_rank[0 if is_master else index + (1 if self._has_master(items) else 0)] = name
        if rank not in by_rank:
            raise BackendError(f"job {job} has no pod with rank {rank} (pods: {sorted(by_rank.values()) or 'none'})",
                               "the pods may not be created yet: `dist-jobs status --backend k8s " + job + "`")
        return by_rank[rank]

    @staticmethod
    def _has_master(items: list[Any]) -> bool:
        def rtype(pod: Any) -> str:
            meta = pod.metadata if hasattr(pod, "metadata") else pod["metadata"]
            labels = (meta.labels if hasattr(meta, "labels") else meta.get("labels")) or {}
            return labels.get("training.kubeflow.org/replica-type", "").lower()

        return any(rtype(p) == "master" for p in items)


def job_status(obj: dict[str, Any]) -> JobStatus:
    """Latest true condition as the state; per-replica active/succeeded/failed counts as extras."""
    status = obj.get("status") or {}
    conditions = [c for c in status.get("conditions", []) if c.get("status") == "True"]
    latest = conditions[-1] if conditions else {}
    extra = {rtype: json.dumps(counts, sort_keys=True) for rtype, counts in (status.get("replicaStatuses") or {}).items()}
    return JobStatus(obj["metadata"]["name"], obj["metadata"]["name"], latest.get("type", "Pending"),
                     latest.get("message", ""), extra)
