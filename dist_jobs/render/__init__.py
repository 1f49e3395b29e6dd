"""Rendering: a JobSpec becomes the exact bytes a scheduler receives.

Pure and deterministic: no clock, no environment reads, no scheduler calls. A typed context is
built in Python (`render.slurm.slurm_context`, `render.k8s.k8s_context`) and fed to a jinja2
template from `templates/` with StrictUndefined; the quoting filters of `render.quoting` are the
only way a user value enters the output.
"""

from __future__ import annotations

from typing import Literal

from dist_jobs.errors import DistJobsError
from dist_jobs.render.common import render_template
from dist_jobs.render.k8s import k8s_context
from dist_jobs.render.slurm import slurm_context
from dist_jobs.spec.model import JobSpec

Backend = Literal["slurm", "k8s"]


def render(spec: JobSpec, backend: Backend) -> str:
    """The script or manifest for `backend`; the same bytes `submit` hands to the scheduler."""
    if backend == "slurm":
        return render_template("sbatch.sh.j2", slurm_context(spec))
    if backend == "k8s":
        ctx = k8s_context(spec)
        name = "trainjob.yaml.j2" if spec.k8s.api == "trainjob" else "pytorchjob.yaml.j2"
        return render_template(name, ctx)
    raise DistJobsError(f"unknown backend {backend!r}", "use --backend slurm or --backend k8s")
