"""The backends layer: one interface (`base.Backend`), the registry, and the concrete backends.

The registry is the one list of backends: a name and where its Backend class is. Each backend
is a package (`slurm/`, `k8s/`, `local/`) imported when first asked for, so `render` pays for
no backend's client. A package outside dist_jobs adds one with `register_backend(name,
"module:Class")`, or by declaring it in the `dist_jobs.backends` entry-point group; that group
is read when a name is not registered (reading it costs the query verbs ~20 ms of start-up).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

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
    "Names",
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
    """Every registered backend's name, the built-in ones first."""
    return list(_REGISTRY)


class Names:
    """The backends' names as argparse takes its choices: a name not registered is looked for in
    the entry-point group. Listed (argparse lists them as it adds the flag): those registered."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __contains__(self, name: object) -> bool:
        return name in self.names or (isinstance(name, str) and _known(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)


def _known(name: str) -> bool:
    """Whether `name` is registered, the entry-point group read first where it is not."""
    if name not in _REGISTRY:
        _read_entry_points()
    return name in _REGISTRY


def _read_entry_points() -> None:
    """The backends other packages declare in the `dist_jobs.backends` entry-point group (once)."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    from importlib import metadata  # ~15 ms, and the scan as much: only when a name is not registered

    for point in metadata.entry_points(group=ENTRY_POINTS):
        _REGISTRY.setdefault(point.name, point.value)


def get_backend(name: str, **options: object) -> Backend:
    """The backend called `name`, built with its constructor options (runner, API client, folders)."""
    return backend_class(name)(**options)


def backend_class(name: str) -> type[Backend]:
    """The Backend class of `name`, its module imported now."""
    if not _known(name):
        raise UsageError(f"unknown backend {name!r}", f"use --backend {or_list(backend_names())}")
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
    if not _known(scheme):
        raise UsageError(f"{text!r} is not a job handle", f"a handle looks like {handle_forms()}")
    cls = backend_class(scheme)
    parts = split_handle(text, cls.handle_fields)
    try:
        if parts is None:
            raise ValueError(f"it has not the parts of {cls.handle_form()}")
        return cls.parse_handle(*parts)
    except ValueError:
        raise UsageError(f"{text!r} is not a job handle", f"a handle looks like {handle_forms()}") from None
