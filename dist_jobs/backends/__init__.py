"""The backends layer: one interface (`base.Backend`), the registry, and the concrete backends.

The registry is the one list of backends: a name and where its Backend class is. Each backend
is a package (`slurm/`, `k8s/`, `local/`) imported when first asked for, so `render` pays for
no backend's client. A package outside dist_jobs adds one with `register_backend(name,
"module:Class")`, or by declaring it in the `dist_jobs.backends` entry-point group.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from dist_jobs.backends.base import Backend, JobStatus, Option, Prepared
from dist_jobs.backends.handle import Handle, is_handle, split_handle
from dist_jobs.errors import UsageError

ENTRY_POINTS = "dist_jobs.backends"
_REGISTRY: dict[str, str] = {
    "slurm": "dist_jobs.backends.slurm:SlurmBackend",
    "k8s": "dist_jobs.backends.k8s:K8sBackend",
    "local": "dist_jobs.backends.local:LocalBackend",
}
_plugins_read = False

__all__ = [
    "Backend",
    "JobStatus",
    "Option",
    "Prepared",
    "backend_class",
    "backend_classes",
    "backend_names",
    "get_backend",
    "handle_forms",
    "parse_handle",
    "register_backend",
    "unregister_backend",
]


def register_backend(name: str, target: str) -> None:
    """Add backend `name`, its class at `target` ("package.module:Class"), imported when first used."""
    _REGISTRY[name] = target


def unregister_backend(name: str) -> None:
    """Forget backend `name` (one a test or a plugin added)."""
    _REGISTRY.pop(name, None)


def backend_names() -> list[str]:
    """Every backend's name, the built-in ones first."""
    _read_entry_points()
    return list(_REGISTRY)


def _read_entry_points() -> None:
    """The backends other packages declare in the `dist_jobs.backends` entry-point group (once)."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    for point in metadata.entry_points(group=ENTRY_POINTS):
        _REGISTRY.setdefault(point.name, point.value)


def get_backend(name: str, **options: object) -> Backend:
    """The backend called `name`, built with its constructor options (runner, API client, folders)."""
    return backend_class(name)(**options)


def backend_class(name: str) -> type[Backend]:
    """The Backend class of `name`, its module imported now."""
    names = backend_names()
    if name not in names:
        raise UsageError(f"unknown backend {name!r}", f"use --backend {or_list(names)}")
    module, _, attr = _REGISTRY[name].partition(":")
    found: type[Backend] = getattr(importlib.import_module(module), attr)
    return found


def backend_classes() -> list[type[Backend]]:
    """Every backend's class (each imported now: the CLI's flags and help)."""
    return [backend_class(name) for name in backend_names()]


def or_list(words: list[str]) -> str:
    """`a, b or c`."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def handle_forms() -> str:
    """How a handle looks on each backend: `slurm://CLUSTER/ID, k8s://... or local:///RUN/DIR`."""
    return or_list([cls.handle_form() for cls in backend_classes()])


def parse_handle(text: str) -> Handle:
    """The Handle in `text`, split by the fields its backend declares and checked by it; a
    UsageError naming the expected forms if it is not one."""
    scheme = text.partition("://")[0] if is_handle(text) else ""
    if scheme not in backend_names():
        raise UsageError(f"{text!r} is not a job handle", f"a handle looks like {handle_forms()}")
    cls = backend_class(scheme)
    parts = split_handle(text, cls.handle_fields)
    try:
        if parts is None:
            raise ValueError(f"it has not the parts of {cls.handle_form()}")
        return cls.parse_handle(*parts)
    except ValueError:
        raise UsageError(f"{text!r} is not a job handle", f"a handle looks like {handle_forms()}") from None
