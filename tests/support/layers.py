"""The design card's import rules, read from the source with `ast` (no import runs).

    cli -> api -> backends -> render -> spec -> errors      train -> spec, ranks      ranks: stdlib

A module may import its own layer and the layers below it in the chain. `ranks` (stdlib only) and
`constants`/`errors`/`envnum` sit at the bottom: anyone may import them, and they import nothing of
dist-jobs but the bottom. `train`, the runtime side, may import only spec, ranks and the
bottom; nothing on the render side may import train (it would pull in torch). Every import
counts, also one inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

PACKAGE = REPO / "dist_jobs"
BOTTOM = {"errors", "constants", "envnum"}
# Layer -> the layers it may import (itself always allowed).
ALLOWED: dict[str, set[str]] = {
    "errors": {"constants"},
    "constants": set(),
    "envnum": set(),
    "ranks": BOTTOM,
    # The run directory on shared storage (lock, attempts, progress): stdlib only, like ranks.
    "rundir": BOTTOM,
    "spec": BOTTOM,
    "render": {"spec"} | BOTTOM,
    "backends": {"render", "spec", "ranks", "rundir"} | BOTTOM,
    "api": {"backends", "render", "spec", "ranks", "rundir"} | BOTTOM,
    "cli": {"api", "backends", "render", "spec", "ranks", "rundir"} | BOTTOM,
    "train": {"spec", "ranks", "rundir"} | BOTTOM,
    # `python3 -m dist_jobs.launch -- CMD`: per-task launcher in the job (stdlib only, no spec).
    "launch": {"ranks", "rundir"} | BOTTOM,
    # `python3 -m dist_jobs.nodelist` / `.ports`: stable entry points of rendered scripts.
    "nodelist": {"ranks"},
    "ports": {"ranks"},
    "__main__": {"cli"},
    "__init__": {"api"} | BOTTOM,  # the package facade re-exports the API lazily
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported dist_jobs module
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> list[str]:
    return sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _resolve(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges() -> Iterator[Edge]:
    known = set(modules())
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, source, path.name == "__init__.py")
                # `from dist_jobs.ranks import nodelist` names a module; `from x import f` a name.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in targets:
                if target == "dist_jobs" or target.startswith("dist_jobs."):
                    yield Edge(source, target, node.lineno)


def wrong_way(found: list[Edge]) -> list[str]:
    bad = []
    for edge in found:
        src, dst = layer(edge.source), layer(edge.target)
        if src != dst and dst not in ALLOWED.get(src, set()):
            bad.append(f"{edge.source}:{edge.line} imports {edge.target} ({src} -> {dst} is not allowed)")
    return bad


def cycles(found: list[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each a cycle's members."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        if edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                out.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out
