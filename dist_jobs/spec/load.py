"""Loading a job spec: YAML file + overrides -> JobSpec, or one SpecError with every problem.

Overrides are dotted paths (`slurm.partition`) so CLI flags and the Python API share one path.
`dist_jobs.spec.validate` reports every type problem with the field, the given value and the fix, and
unknown keys get a "did you mean" from the fields that exist at that place.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dist_jobs.errors import MISSING, Problem, SpecError
from dist_jobs.spec import k8s_rules
from dist_jobs.spec.limits import limit_problems
from dist_jobs.spec.model import JobSpec, run_id
from dist_jobs.spec.paths import home_problems
from dist_jobs.spec.profiles import merge
from dist_jobs.spec.reserved import env_problems
from dist_jobs.spec.slurm_time import parse_time
from dist_jobs.spec.train import hang_problems, strategy_problems
from dist_jobs.spec.validate import convert
from dist_jobs.spec.yaml_input import load_yaml, read_spec_file


def load_spec(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    backend: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> JobSpec:
    """Read `path` (or take `data`), apply dotted `overrides`, validate everything at once; with
    `backend` also what that backend needs (Kubernetes syntax and operator rules for `k8s`).
    `defaults`: spec fields under the file's (a profile's, dist_jobs.spec.profiles)."""
    source = str(path) if path else "job spec"
    raw: dict[str, Any] = dict(data or {})
    if path is not None:
        raw = read_yaml(Path(path))
    if defaults:
        raw = merge(merge({}, defaults), raw)
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    spec = convert(JobSpec, raw, source)
    problems = cross_checks(spec, backend)
    if problems:
        raise SpecError(problems, source)
    return spec


def read_yaml(path: Path) -> dict[str, Any]:
    loaded = load_yaml(read_spec_file(path), str(path))
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SpecError(
            [
                Problem(
                    "(top level)",
                    loaded,
                    "must be a mapping of spec keys",
                    "start the file with keys such as `name:` and `nodes:`",
                )
            ],
            str(path),
        )
    return loaded


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[leaf] = value


def cross_checks(spec: JobSpec, backend: str | None = None) -> list[Problem]:
    """Rules that involve several fields, and the target backend's rules; all returned together."""
    problems: list[Problem] = []
    if spec.gpus_per_node == 0 and spec.procs_per_node is None:
        problems.append(
            Problem(
                "procs_per_node",
                MISSING,
                "is required for a CPU-only job (gpus_per_node is 0)",
                "set procs_per_node: N (processes per node), e.g. --procs-per-node 2",
            )
        )
    gpus, procs, share = spec.gpus_per_node, spec.procs, spec.train.procs_per_device
    if gpus and procs > gpus * share:
        problems.append(
            Problem(
                "procs_per_node",
                procs,
                f"exceeds gpus_per_node x train.procs_per_device = {gpus} x {share}",
                f"lower procs_per_node to {gpus * share} or set train.procs_per_device: "
                f"{-(-procs // gpus)} to share GPUs",
            )
        )
    if not run_id(spec.name):
        problems.append(
            Problem(
                "name",
                spec.name,
                "has no letter or digit to build a run name from",
                "use letters, digits, '.', '_' or '-'",
            )
        )
    if spec.command is not None and not spec.command:
        problems.append(Problem("command", [], "is empty", "give the program and its arguments, or drop the key"))
    if spec.time is not None and parse_time(spec.time) is None:
        problems.append(
            Problem(
                "time",
                spec.time,
                "is not a SLURM time limit",
                "use minutes (90), HH:MM:SS (04:00:00) or D-HH:MM:SS (1-00:00:00)",
            )
        )
    problems += env_problems(spec.env) + home_problems(spec) + limit_problems(spec)
    problems += hang_problems(spec.train) + strategy_problems(spec.train) + _k8s_checks(spec)
    if backend == "k8s":
        problems += k8s_rules.problems(spec)
    return problems


def _k8s_checks(spec: JobSpec) -> list[Problem]:
    k8s = spec.k8s
    problems: list[Problem] = []
    if (k8s.min_nodes is None) != (k8s.max_nodes is None):
        problems.append(
            Problem(
                "k8s.min_nodes/max_nodes",
                (k8s.min_nodes, k8s.max_nodes),
                "must be given together",
                "set both, e.g. min_nodes: 2, max_nodes: 4",
            )
        )
    elif k8s.min_nodes is not None and k8s.max_nodes is not None:
        if k8s.min_nodes > k8s.max_nodes:
            problems.append(
                Problem("k8s.min_nodes", k8s.min_nodes, f"is above k8s.max_nodes ({k8s.max_nodes})", "swap them")
            )
        if not k8s.min_nodes <= spec.nodes <= k8s.max_nodes:
            problems.append(
                Problem(
                    "nodes",
                    spec.nodes,
                    f"is outside k8s.min_nodes..max_nodes ({k8s.min_nodes}..{k8s.max_nodes})",
                    "pick nodes inside that range",
                )
            )
    return problems
