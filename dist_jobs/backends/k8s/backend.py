"""Kubernetes backend on the official `kubernetes` client's REST layer (client.py).

Creates PyTorchJobs (or TrainJobs) with fieldValidation=Strict: by default the apiserver prunes
an unknown field silently and the Python client never shows the warning. Each submission stamps
its pods with an annotation (the restart counter's key, dist_jobs.rundir.attempts). API errors
become messages (errors.py). What differs between a PyTorchJob and a TrainJob (API path, pod
labels, a pod's rank, the log's container, the job's environment) is its kind's (kinds.py), so a
pod rank means the same thing as the operator's RANK env; `logs` tells the ranks in them apart (logs.py).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dist_jobs.backends.base import Backend, JobStatus, Option, Prepared, PreparedSweep, run_dir_of
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.k8s.client import KubeClient, KubeconfigError, in_cluster, load
from dist_jobs.backends.k8s.errors import api_error, handle, no_config, not_started, unreachable
from dist_jobs.backends.k8s.kinds import KINDS, JobKind
from dist_jobs.backends.k8s.logs import PREFIX_ENV, PodLog, followed, labelled, of_rank, pod_logs
from dist_jobs.backends.k8s.ranks import job_status, waiting_reason, with_ranks
from dist_jobs.errors import BackendError, Problem, UsageError
from dist_jobs.spec.flags import SpecFlag

# The CLI reads every backend's class for its flags: what only submit, render and a snapshot
# use (yaml, the renderer, the spec classes) is imported where used (tests/unit/test_imports.py).
if TYPE_CHECKING:
    from dist_jobs.spec import JobSpec

MANAGED = "app.kubernetes.io/managed-by=dist-jobs"


def load_client(kubeconfig: str | None = None, context: str | None = None) -> KubeClient:
    """A client from a kubeconfig ($KUBECONFIG, ~/.kube/config) or, without one, the in-cluster
    service account (as kubectl does)."""
    try:
        client = load(kubeconfig, context)
    except KubeconfigError as exc:
        raise no_config(kubeconfig, context, exc) from None
    if client is None:
        client = in_cluster()
    if client is None:
        raise no_config(None, None, None)
    return client


class K8sBackend(Backend):
    name = "k8s"
    summary = "manifest"
    options = (
        Option("--namespace", "namespace", "Kubernetes namespace (default: 'default')", lookup_only=True),
        Option(
            "--kind",
            "kind",
            "Kubernetes: the kind of a bare job name (default PyTorchJob; a handle carries its kind; list: both)",
            choices=tuple(KINDS),
            lookup_only=True,
        ),
        Option("--context", "context", "kubeconfig context"),
        Option("--kubeconfig", "kubeconfig", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"),
    )
    spec_flags = (
        SpecFlag("--namespace", "k8s.namespace", "Kubernetes namespace"),
        SpecFlag("--pvc", "k8s.pvc", "Kubernetes PVC holding the checkpoint directory"),
        SpecFlag("--api", "k8s.api", "Kubernetes API: pytorchjob or trainjob"),
    )
    spec_flags_title = "Kubernetes flags"
    inherits_environment = False  # a pod's environment is the spec's alone
    handle_fields = ("namespace", "kind")
    handle_id = "NAME"
    sweep_summary = "a PyTorchJob per trial"

    def __init__(
        self,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        api_client: KubeClient | None = None,
        kind: str | None = None,
    ) -> None:
        if kind is not None and kind not in KINDS:
            raise UsageError(f"unknown Kubernetes job kind {kind!r}", f"use one of {', '.join(KINDS)}")
        self.namespace = namespace
        self._context, self._kubeconfig = context, kubeconfig
        self._client = api_client
        # A bare name is a PyTorchJob's; list() shows every kind unless one was asked for.
        self.kind: JobKind = KINDS[kind or "PyTorchJob"]
        self._kinds = (KINDS[kind],) if kind else tuple(KINDS.values())
        self._seen: dict[str, dict[str, Any]] = {}  # the last object _get returned, by name

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            self._client = load_client(self._kubeconfig, self._context)
        return self._client

    def _ns(self) -> str:
        """--namespace, else the kubeconfig context's namespace, else `default` (kubectl's order)."""
        return self.namespace or self.client.namespace or "default"

    def handle(self, job_id: str) -> Handle:
        return Handle("k8s", job_id, namespace=self._ns(), kind=self.kind.name)

    @classmethod
    def parse_handle(cls, job_id: str, fields: dict[str, str]) -> Handle:
        """A kind the apiserver serves (any case), a name without a slash."""
        if "/" in job_id:
            raise ValueError(f"{job_id!r} is no Kubernetes name")
        kind = {k.lower(): k for k in KINDS}.get(fields["kind"].lower())
        if kind is None and fields["kind"] and job_id:
            text = f"k8s://{fields['namespace']}/{fields['kind']}/{job_id}"
            raise UsageError(f"job handle {text!r}: unknown kind {fields['kind']!r}", f"use one of {', '.join(KINDS)}")
        return super().parse_handle(job_id, {**fields, "kind": kind or ""})

    def log_ranks(self, spec: JobSpec) -> builtins.list[int] | None:
        """One log per pod: a pod's first rank names it."""
        return builtins.list(range(spec.nodes))

    @contextlib.contextmanager
    def _translated(
        self, what: str, job: tuple[str, str, str] | None = None, method: str = "GET", forbidden: str = ""
    ) -> Iterator[None]:
        """ApiException -> message and hint; a socket failure -> what went wrong. `job`: (kind,
        namespace, name); `forbidden`: the hint for a 403 (errors.api_error)."""
        from urllib3.exceptions import HTTPError  # urllib3 comes with kubernetes, an optional dependency ([k8s])

        kind, namespace, name = job or (self.kind.name, "", "")
        try:
            yield
        except self.client.api_exception as exc:
            raise api_error(exc, what, kind, namespace, name, self.client.host, forbidden) from None
        except (HTTPError, OSError) as exc:
            job_id = handle(kind, namespace, name) if name else ""
            raise unreachable(self.client.host, exc, what, job_id, method) from None

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        job: tuple[str, str, str] | None = None,
        forbidden: str = "",
        **kwargs: Any,
    ) -> Any:
        with self._translated(what, job, method, forbidden):
            return self.client.request(method, path, **kwargs)

    def _job(self, name: str) -> tuple[str, str, str]:
        return self.kind.name, self._ns(), name

    def prepare(self, spec: JobSpec) -> Prepared:
        from dist_jobs.backends.k8s.code import with_code  # submit's and render's alone (as above)
        from dist_jobs.render.k8s import pod_workdir

        suffix = "trainjob" if spec.k8s.api == "trainjob" else "pytorchjob"
        payload = self.render(spec)
        if spec.snapshot:  # the code of this folder, as a ConfigMap after the job (backends.k8s.code)
            payload = with_code(spec, payload, Path.cwd())
        run_dir = run_dir_of(spec, Path(pod_workdir(spec)))  # as the pods see it
        return Prepared("k8s", spec, payload, f"{spec.run_id}.{suffix}.yaml", run_dir)

    def render(self, spec: JobSpec) -> str:
        """The job's manifest and, after it, its pods' ServiceAccount, Role and RoleBinding
        (render.k8s.access_objects); a snapshot's ConfigMap is made by submit."""
        from dist_jobs.render import render  # render's alone (as above)
        from dist_jobs.render.k8s import access_manifest

        return render(spec, "k8s") + access_manifest(spec)

    def _create(self, prepared: Prepared, dry_run: bool) -> dict[str, Any]:
        import uuid  # with yaml, submit's alone (as above)

        import yaml

        from dist_jobs.backends.k8s.code import annotated

        body = stamped(next(d for d in yaml.safe_load_all(prepared.payload) if d), uuid.uuid4().hex[:12])
        if prepared.spec.snapshot:  # the commit it runs, for status
            body = annotated(body, prepared.payload)
        kind = body["kind"]  # the manifest decides: a TrainJob spec goes to trainjobs whatever self.kind is
        namespace = body["metadata"].get("namespace") or self._ns()
        query = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
        job = (kind, namespace, body["metadata"]["name"])
        what = f"create {kind} {namespace}/{job[2]}"
        return self._call(what, "POST", KINDS[kind].path(namespace), job, query=query, body=body)

    def hand_over(self, prepared: Prepared) -> Handle:
        created = self._create(prepared, dry_run=False)
        self._create_owned(prepared, created, dry_run=False)
        meta = created["metadata"]  # where _create put it, as the manifest (not self.kind) decides
        namespace = str(meta.get("namespace") or self._ns())
        return Handle("k8s", str(meta["name"]), namespace=namespace, kind=str(created["kind"]))

    def submitted(self, prepared: Prepared, handle: Handle) -> None:
        """Nothing: the job object names its run directory (run_dir()) and the apiserver lists the
        jobs (list()), for any host with the kubeconfig; a record here would be a second copy."""
        return None

    def _create_owned(self, prepared: Prepared, job: dict[str, Any], dry_run: bool) -> None:
        """What follows the job in the payload (a snapshot's ConfigMap, the pods' ServiceAccount,
        Role and RoleBinding), each owned by the `job` just created, so that deleting the job
        deletes them; if one cannot be made, the job goes too (its pods would wait for it forever)."""
        from dist_jobs.backends.k8s.code import companions, owned  # submit's alone (as above)
        from dist_jobs.render.k8s import ACCESS_FORBIDDEN_HINT, ACCESS_KINDS

        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        query = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
        try:
            for obj in companions(prepared.payload)[1:]:
                body = owned(obj, job)
                what = f"create {obj['kind']} {namespace}/{body['metadata']['name']}"
                forbidden = ACCESS_FORBIDDEN_HINT if obj["kind"] in ACCESS_KINDS else ""
                self._call(what, "POST", owned_path(obj, namespace), forbidden=forbidden, query=query, body=body)
        except BackendError:
            if not dry_run:
                with contextlib.suppress(BackendError):
                    self._call(
                        f"delete {job['kind']} {namespace}/{name}",
                        "DELETE",
                        KINDS[job["kind"]].path(namespace, name),
                    )
            raise

    def check(self, prepared: Prepared) -> str:
        """The apiserver's dry run (dryRun=All, fieldValidation=Strict); skipped without a cluster."""
        if self._client is None and not (self._kubeconfig or self._context):
            try:
                _ = self.client  # builds the client: raises when no cluster is configured
            except BackendError as exc:  # no cluster configured: the rendered manifest is the dry run
                return f"skipped ({exc.message})"
        created = self._create(prepared, dry_run=True)
        self._create_owned(prepared, created, dry_run=True)
        return "accepted by the apiserver (dryRun=All, fieldValidation=Strict); nothing was created"

    def _get(self, name: str) -> dict[str, Any]:
        path = self.kind.path(self._ns(), name)
        obj = self._call(f"get {self.kind.name} {self._ns()}/{name}", "GET", path, self._job(name))
        self._seen[name] = obj
        return obj

    def owner(self, job_id: str) -> str | None:
        """The job as its pods name it in progress.json (DIST_JOBS_LOCK_OWNER, set by render.k8s)."""
        env = [e for e in self.kind.env(self._seen.get(job_id) or self._get(job_id)) if isinstance(e, dict)]
        return next((e.get("value") for e in env if e.get("name") == "DIST_JOBS_LOCK_OWNER"), None)

    def run_dir(self, job_id: str) -> Path:
        """`<checkpoint dir>/<run>` as the pods see it (the job's DIST_JOBS_CHECKPOINT_DIR, under the
        volume's mount path): readable here where this host mounts the same shared filesystem there."""
        obj = self._seen.get(job_id) or self._get(job_id)
        env = {e.get("name"): e.get("value") for e in self.kind.env(obj) if isinstance(e, dict)}
        root, run = env.get("DIST_JOBS_CHECKPOINT_DIR"), env.get("DIST_JOBS_RUN")
        if not (isinstance(root, str) and isinstance(run, str)):
            raise BackendError(
                f"{self.kind.name} {self._ns()}/{job_id} does not name its run directory (no DIST_JOBS_CHECKPOINT_DIR)",
                "it was not submitted by dist-jobs: read the run's files from a pod that mounts its volume",
            )
        return Path(root) / run

    def status(self, job_id: str) -> JobStatus:
        obj = self._get(job_id)
        status = with_ranks(job_status(obj), self._pods(job_id, self.kind.pods_of(job_id)), self.kind, obj)

        from dist_jobs.backends.k8s.code import code_line  # a status's alone (as above)

        code = code_line(obj)  # submitted with a snapshot: the commit it runs, as on SLURM
        status = dataclasses.replace(status, extra={**status.extra, "code": code}) if code else status
        return status if status.finished else self._with_kept_away(job_id, status, obj)

    def _with_kept_away(self, job_id: str, status: JobStatus, obj: dict[str, Any]) -> JobStatus:
        """A job whose templates refuse nodes (a pod blamed its node: rundir.node_affinity): which,
        and why and until when where this host reads the run directory, in `kept_away` and the detail."""
        from dist_jobs.rundir.node_affinity import kept_off  # a status's alone (as above)
        from dist_jobs.rundir.quarantine import kept_away
        from dist_jobs.spec.k8s_rules import SUBMISSION_ANNOTATION

        templates = self.kind.templates(obj)
        nodes = list(dict.fromkeys(n for t in templates for n in kept_off(t.get("spec") or {})))
        if not nodes:
            return status
        # every template carries the same submission stamp (stamped())
        submission = ((templates[0].get("metadata") or {}).get("annotations") or {}).get(SUBMISSION_ANNOTATION, "")
        try:
            records = {q.node: q.told() for q in kept_away(self.run_dir(job_id), submission)}
        except BackendError:  # not submitted by dist-jobs: the apiserver's word alone
            records = {}
        told = ", ".join(records.get(node, node) for node in nodes)
        detail = "; ".join(part for part in (status.detail, f"keeps away from {told}") if part)
        return dataclasses.replace(status, detail=detail, extra={**status.extra, "kept_away": told})

    def list(self) -> builtins.list[JobStatus]:
        out = []
        for kind in self._kinds:
            path, what = kind.path(self._ns()), f"list {kind.plural}.{kind.group} in {self._ns()}"
            try:
                found = self._call(what, "GET", path, query={"labelSelector": MANAGED})
            except BackendError as exc:
                if len(self._kinds) > 1 and "404 page not found" in exc.message:
                    continue  # this cluster has no such CRD: none of that kind to list
                raise
            for item in found.get("items", []):
                status = job_status(item)
                handle = Handle("k8s", status.job_id, namespace=self._ns(), kind=kind.name)
                out.append(dataclasses.replace(status, handle=str(handle)))
        return out

    def stop(self, job_id: str) -> None:
        """Delete the job; the apiserver says when there is none (exists() is not asked first)."""
        # Foreground: the job stays (Terminating) until its pods are gone, so a resubmit under the
        # same name cannot meet the old run's pods.
        path = self.kind.path(self._ns(), job_id)
        query = {"propagationPolicy": "Foreground"}
        self._call(f"delete {self.kind.name} {self._ns()}/{job_id}", "DELETE", path, self._job(job_id), query=query)

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Every rank's lines, `[rank N] ...` (rank None), or rank `rank`'s; follow=True: every
        pod's, replaced and restarted ones included, until the job ends (logs.py)."""
        if rank is not None and rank < 0:
            raise UsageError(f"--rank {rank}: a rank is 0 or more", "rank 0 is the first process of the master pod")
        torchrun = any(isinstance(e, dict) and e.get("name") == PREFIX_ENV for e in self.kind.env(self._get(job_id)))
        if rank is not None and not torchrun:  # one process per pod: the pod rank is the rank
            yield from self._pod_log(job_id, rank, follow)
            return
        lines = self._all_pod_lines(job_id, follow, rank)
        if rank is not None:
            yield from of_rank(lines, rank)
            return
        yield from (labelled(line, pod, torchrun) for pod, line in lines)

    def _all_pod_lines(self, job_id: str, follow: bool, rank: int | None) -> Iterator[tuple[int, str]]:
        def stream(log: PodLog) -> Iterator[str]:
            path = f"/api/v1/namespaces/{self._ns()}/pods/{log.name}/log"
            with self._translated(f"logs of pod {self._ns()}/{log.name}", self._job(job_id)):
                yield from self.client.lines(path, {"container": log.container, "follow": "true"})

        if follow:
            yield from followed(lambda: self._pod_logs(job_id), stream, lambda: self.status(job_id).finished)
            return
        logs = self._pod_logs(job_id)
        if not logs:
            self._pod_for_rank(job_id, rank or 0)  # raises: no pod yet, or why it has no log
        for log in logs:
            path = f"/api/v1/namespaces/{self._ns()}/pods/{log.name}/log"
            with self._translated(f"logs of pod {self._ns()}/{log.name}", self._job(job_id)):
                text = self.client.text(path, {"container": log.container})
            yield from ((log.rank, line) for line in text.splitlines())

    def _pod_logs(self, job_id: str) -> builtins.list[PodLog]:
        obj = self._seen.get(job_id) or self._get(job_id)
        return pod_logs(self._pods(job_id, self.kind.pods_of(job_id)), self.kind, obj)

    def _pod_log(self, job_id: str, rank: int, follow: bool) -> Iterator[str]:
        """The lines of the pod with pod rank `rank`; follow=True streams until the container ends."""
        pod, container = self._pod_for_rank(job_id, rank)
        path = f"/api/v1/namespaces/{self._ns()}/pods/{pod}/log"
        query = {"container": container, **({"follow": "true"} if follow else {})}
        with self._translated(f"logs of pod {self._ns()}/{pod}", self._job(job_id)):
            if follow:
                yield from self.client.lines(path, query)
                return
            text = self.client.text(path, query)
        yield from text.splitlines()

    def _pods(self, job: str, selector: str) -> builtins.list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{self._ns()}/pods"
        found = self._call(f"list pods of {job}", "GET", path, self._job(job), query={"labelSelector": selector})
        return found.get("items") or []

    def _pod_for_rank(self, job: str, rank: int) -> tuple[str, str]:
        """(pod name, container) of `rank`, selected by the operator's (or JobSet's) pod labels."""
        obj = self._get(job)
        found = self._pods(job, self.kind.rank_selector(job, rank, obj))
        pods = [p for p in found if self.kind.rank_of(p, obj) == rank]
        if not pods:
            raise self._no_pod(job, rank)
        # a restarted pod can briefly coexist with its terminating predecessor: take the live, newest one
        pod = max(
            pods, key=lambda p: ("deletionTimestamp" not in p["metadata"], p["metadata"].get("creationTimestamp"))
        )
        container = _container(pod, self.kind.container)
        waiting = waiting_reason(pod, container)
        if waiting is not None:  # the apiserver answers 200 with no text for a pod not yet running
            raise not_started(self.kind.name, self._ns(), job, pod["metadata"]["name"], waiting)
        return pod["metadata"]["name"], container

    def _no_pod(self, job: str, rank: int) -> BackendError:
        names = ", ".join(sorted(p["metadata"]["name"] for p in self._pods(job, self.kind.pods_of(job))))
        return BackendError(
            f"{self.kind.name} {self._ns()}/{job} has no pod with rank {rank} (its pods: {names or 'none yet'})",
            f"ranks run from 0 to the number of pods - 1; pods appear once the job is scheduled: "
            f"dist-jobs status {handle(self.kind.name, self._ns(), job)}",
        )

    # A sweep: one labelled job per trial, all created at once (backends.k8s.sweep).

    def sweep_problems(self, max_parallel: int | None) -> builtins.list[Problem]:
        from dist_jobs.backends.k8s.sweep import problems  # a sweep's alone (tests/unit/test_imports.py)

        return problems(max_parallel)

    def trial_overrides(self, sweep: str, index: int) -> dict[str, str]:
        return {"k8s.labels.dist-jobs/sweep": sweep, "k8s.labels.dist-jobs/trial": str(index)}

    def prepare_sweep(
        self, name: str, params: builtins.list[dict[str, Any]], specs: builtins.list[JobSpec], max_parallel: int | None
    ) -> PreparedSweep:
        """Every trial's manifest, one YAML stream."""
        plan = super().prepare_sweep(name, params, specs, max_parallel)
        return dataclasses.replace(plan, text="---\n".join(payload for _, payload in plan.payloads))

    def sweep_roots(self, name: str, first: JobSpec, here: Path) -> tuple[Path, str]:
        from dist_jobs.backends.k8s.sweep import roots  # a sweep's alone (as above)

        return roots(name, first, here)


def owned_path(obj: dict[str, Any], namespace: str) -> str:
    """Where an object the job owns is created: its API group's path for its kind."""
    version, plural = obj["apiVersion"], obj["kind"].lower() + "s"  # configmaps, serviceaccounts, roles, ...
    prefix = "/api/v1" if version == "v1" else f"/apis/{version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def stamped(body: dict[str, Any], submission: str) -> dict[str, Any]:
    """The manifest with this submission's id on every pod template (the downward API hands it to
    the pods as DIST_JOBS_SUBMISSION)."""
    from dist_jobs.spec.k8s_rules import SUBMISSION_ANNOTATION  # submit's alone (as above)

    for template in KINDS[body["kind"]].templates(body):
        template.setdefault("metadata", {}).setdefault("annotations", {})[SUBMISSION_ANNOTATION] = submission
    return body


def _container(pod: dict[str, Any], preferred: str) -> str:
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    return preferred if preferred in names or not names else str(names[0])
