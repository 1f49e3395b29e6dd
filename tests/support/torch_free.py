"""Which test files the torch-free sessions leave out, read from the source with `ast` (nothing
is imported): a file that imports torch, torchvision, lightning or a `dist_jobs.train` module that
does, directly or through a `support` module, at any depth, cannot even be collected there.

An import inside a function does not count: a test that runs torch without its file importing it
says so itself with `@requires("torch")` (support.tiers), and `--torch-free` deselects it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from support.paths import REPO

TORCH_PACKAGES = {"torch", "torchvision", "lightning", "pytorch_lightning"}
ROOTS = {"dist_jobs": REPO, "support": REPO / "tests"}


def _imports(path: Path) -> set[str]:
    """What the file imports when it is imported: its module-level statements (also those under
    `if`/`try`), not the bodies of its functions and classes."""
    names: set[str] = set()
    for node in _module_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        names.update(_required(node))
    return names


def _required(node: ast.stmt) -> set[str]:
    """`require_module("torch")` (support.tiers) at module level imports it as surely as `import`."""
    value = getattr(node, "value", None)
    if not isinstance(value, ast.Call) or not value.args or not isinstance(value.args[0], ast.Constant):
        return set()
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return {str(value.args[0].value)} if name == "require_module" else set()


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        found.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            found += _module_level([n for n in getattr(node, field, []) if isinstance(n, ast.stmt)])
        for handler in getattr(node, "handlers", []):
            found += _module_level(handler.body)
    return found


def _source(module: str) -> Path | None:
    """The file of a dist_jobs or support module (a package's __init__.py), None for others."""
    top = module.split(".")[0]
    if top not in ROOTS:
        return None
    base = ROOTS[top].joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def file_needs_torch(path: Path) -> bool:
    """True when the file imports torch, at any depth through dist_jobs and support modules."""
    seen: set[Path] = set()
    stack = [path]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _imports(current):
            if name.split(".")[0] in TORCH_PACKAGES:
                return True
            source = _source(name)
            if source is not None:
                stack.append(source)
    return False
