"""Per-cluster profiles: the settings every submit to a cluster repeats, said once.

`$XDG_CONFIG_HOME/dist-jobs/config.yaml` (default `~/.config/dist-jobs/config.yaml`):

    default: gpu-cluster          # the profile used when neither --profile nor $DIST_JOBS_PROFILE names one
    defaults:                     # every profile's base (and the settings when no profile is chosen)
      checkpoint_dir: ~/checkpoints
    profiles:
      gpu-cluster:
        backend: slurm            # the scheduler when no --backend is given
        slurm: {partition: gpu, account: ml, qos: normal}
        setup: ["module load cuda"]
      k8s-prod:
        backend: k8s
        context: prod             # kubeconfig context (and `kubeconfig: PATH`)
        k8s: {namespace: training, image: registry/ml:1.4}

Any job spec field may appear in a profile or under `defaults`, as in job.yaml. Precedence, lowest
first: the file's `defaults` < the chosen profile < job.yaml < flags.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dist_jobs.errors import MISSING, Problem, SpecError

PROFILE_VAR = "DIST_JOBS_PROFILE"
# Not spec fields: how to reach the scheduler. Which backends there are and the options each
# takes are the backend registry's (dist_jobs.backends), which the caller hands in.
Schedulers = Mapping[str, Sequence[str]]  # each backend's name: the options a profile may give it
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Profile:
    """The settings a config file gives a job: spec fields (as in job.yaml), scheduler options,
    and for each dotted spec field set, where it came from."""

    name: str = ""  # "" when no profile is chosen (the file's defaults alone, if any)
    path: str = ""  # the config file, "" when there is none
    spec: dict[str, Any] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    root = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(root) / "dist-jobs" / "config.yaml"


def load_profile(
    name: str | None = None, environ: Mapping[str, str] | None = None, schedulers: Schedulers | None = None
) -> Profile:
    """The profile `name` (else $DIST_JOBS_PROFILE, else the file's `default:`) merged over the
    file's `defaults`; an empty Profile without a config file. Bad names and fields: SpecError.
    `schedulers`: the backends a profile may name and their options (none: it may name none)."""
    backends = schedulers or {}
    options = ("backend", *dict.fromkeys(o for names in backends.values() for o in names))
    env = os.environ if environ is None else environ
    path = config_path(env)
    wanted = name or env.get(PROFILE_VAR) or None
    if not path.is_file():
        if wanted:
            raise SpecError(
                [Problem("--profile", wanted, f"names a profile, but there is no config file {path}", _HOW)], str(path)
            )
        return Profile()
    data = _read(path, backends, options)
    wanted = wanted or data.get("default") or None
    profiles = data.get("profiles") or {}
    if wanted is not None and wanted not in profiles:
        known = ", ".join(sorted(profiles)) or "none yet"
        field = "--profile" if name else (PROFILE_VAR if env.get(PROFILE_VAR) else "default")
        fix = f"use one of the profiles in {path}: {known}"
        raise SpecError([Problem(field, wanted, "is no profile of the config file", fix)], str(path))
    spec: dict[str, Any] = {}
    given: dict[str, str] = {}
    sources: dict[str, str] = {}
    layers = [("defaults", data.get("defaults") or {})]
    if wanted is not None:
        layers.append((f"profile {wanted}", profiles[wanted]))
    for label, layer in layers:
        given.update({k: str(layer[k]) for k in options if k in layer})
        fields = {k: v for k, v in layer.items() if k not in options}
        merge(spec, fields)
        sources.update(dict.fromkeys(leaves(fields), f"{label} ({path})"))
        sources.update({k: f"{label} ({path})" for k in options if k in layer})
    return Profile(wanted or "", str(path), spec, given, sources)


_HOW = "create it (see README: Profiles), or drop --profile / $DIST_JOBS_PROFILE"


def _read(path: Path, known: Schedulers, options: tuple[str, ...]) -> dict[str, Any]:
    from dist_jobs.spec.yaml_input import load_yaml  # yaml: the query verbs load none (test_imports)

    loaded = load_yaml(path.read_text(), str(path)) or {}
    problems: list[Problem] = []
    if not isinstance(loaded, dict):
        raise SpecError([Problem("(top level)", loaded, "must be a mapping", "start with `profiles:`")], str(path))
    for key in loaded:
        if key not in ("default", "defaults", "profiles"):
            problems.append(Problem(str(key), MISSING, "is not a config file key", "use default, defaults, profiles"))
    profiles = loaded.get("profiles") or {}
    if not isinstance(profiles, dict):
        problems.append(Problem("profiles", profiles, "must map names to settings", "e.g. profiles: {gpu: {...}}"))
        profiles = {}
    layers = {"defaults": loaded.get("defaults") or {}, **{f"profiles.{k}": v or {} for k, v in profiles.items()}}
    for where, layer in layers.items():
        problems += _layer_problems(where, layer, known, options)
    if problems:
        raise SpecError(problems, str(path))
    return {**loaded, "profiles": {k: v or {} for k, v in profiles.items()}}


def _layer_problems(where: str, layer: Any, known: Schedulers, options: tuple[str, ...]) -> list[Problem]:
    """A profile's (or the defaults') problems: its name, its options, and its spec fields, each
    as job.yaml would have them (every field is optional here: the job fills in the rest)."""
    if where.startswith("profiles.") and not _NAME.fullmatch(where[len("profiles.") :]):
        return [Problem(where, MISSING, "is not a profile name", "use letters, digits, '.', '_' or '-'")]
    if not isinstance(layer, dict):
        return [Problem(where, layer, "must be a mapping of spec fields", "e.g. slurm: {partition: gpu}")]
    problems = []
    backend = layer.get("backend")
    if backend is not None and backend not in known:
        problems.append(Problem(f"{where}.backend", backend, "is no backend", f"use one of {', '.join(known)}"))
    fields = {k: v for k, v in layer.items() if k not in options}
    if fields:
        # the spec classes (msgspec): the query verbs, which read profiles, load none (test_imports)
        from dist_jobs.spec.model import JobSpec
        from dist_jobs.spec.validate import convert

        try:
            convert(JobSpec, {"name": "profile", **fields}, where)
        except SpecError as exc:
            problems += [replace(p, field=f"{where}.{p.field}") for p in exc.problems]
    return problems


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged into `base` in place: mappings key by key, anything else replaced."""
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def leaves(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths of every non-mapping value in `data`."""
    out: list[str] = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        out += leaves(value, dotted + ".") if isinstance(value, Mapping) and value else [dotted]
    return out
