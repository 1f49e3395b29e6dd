"""The architecture, enforced: imports go one way between layers and no module cycle exists."""

from __future__ import annotations

import ast
import re

from support import layers
from support.paths import REPO


def test_every_module_belongs_to_a_known_layer() -> None:
    unknown = sorted({layers.layer(m) for m in layers.modules()} - set(layers.ALLOWED))
    assert not unknown, f"modules outside the design card's layers: {unknown}"


def test_imports_go_one_way() -> None:
    bad = layers.wrong_way(list(layers.edges()))
    assert not bad, "wrong-way imports:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    found = layers.cycles(list(layers.edges()))
    assert not found, f"import cycles: {found}"


def test_ranks_and_the_bottom_import_only_the_standard_library() -> None:
    import sys

    third_party = []
    for path in [
        *(REPO / "dist_jobs" / "ranks").glob("*.py"),
        *(REPO / "dist_jobs" / "rundir").glob("*.py"),  # job scripts run it before any environment is set up
        REPO / "dist_jobs" / "backends" / "local" / "keeper.py",
        REPO / "dist_jobs" / "errors.py",
        REPO / "dist_jobs" / "constants.py",
        REPO / "dist_jobs" / "envnum.py",
    ]:
        tree = ast.parse(path.read_text())
        # what mypy alone reads (`if TYPE_CHECKING:`, e.g. typing_extensions) never runs
        checking_only = {
            id(inner)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for stmt in block.body
            for inner in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in checking_only:
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("dist_jobs", "__future__"):
                    third_party.append(f"{path.name}: {name}")
    assert not third_party, third_party


def test_the_checker_catches_a_wrong_way_edge_and_a_cycle() -> None:
    # The checks above pass on the tree; this shows they would fail on a bad one.
    up = layers.Edge("dist_jobs.spec.model", "dist_jobs.render.common", 1)
    torch_side = layers.Edge("dist_jobs.backends.local", "dist_jobs.train.loop", 1)
    assert len(layers.wrong_way([up, torch_side])) == 2
    loop = [
        layers.Edge("dist_jobs.backends.base", "dist_jobs.backends.slurm", 1),
        layers.Edge("dist_jobs.backends.slurm", "dist_jobs.backends.base", 2),
    ]
    assert layers.cycles(loop) == [["dist_jobs.backends.base", "dist_jobs.backends.slurm"]]


# A smell, not a rule (issue 25): one concept read top to bottom beats fragments split to fit.
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 50


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for path in sorted((REPO / "dist_jobs").rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(REPO)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}(): {lines} lines")
    assert not too_long, "split these:\n" + "\n".join(too_long)


def test_the_local_keeper_imports_nothing_of_dist_jobs() -> None:
    # It runs as a script under `python -I`, where the package is not importable, and must start fast.
    tree = ast.parse((REPO / "dist_jobs" / "backends" / "local" / "keeper.py").read_text())
    found = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").startswith("dist_jobs"))
        or isinstance(node, ast.Import)
        and any(a.name.startswith("dist_jobs") for a in node.names)
    ]
    assert not found, f"keeper.py imports dist_jobs at lines {found}"


def test_the_cli_names_no_backend_and_reads_them_through_the_api() -> None:
    """Every backend-shaped thing (its flags, help, sweeps, what runs here) is its Backend class's,
    read from the registry: a new backend needs no line in dist_jobs/cli."""
    names = re.compile(r"slurm|k8s|kubernetes|local|submitit", re.IGNORECASE)
    shell_local = "    local cur="  # bash's keyword, in the completion script's shell code
    found = []
    for path in sorted((REPO / "dist_jobs" / "cli").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if names.search(line) and not line.startswith(shell_local):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "backend names in the CLI:\n" + "\n".join(found)
    direct = [e for e in layers.edges() if e.source.startswith("dist_jobs.cli") and ".backends" in e.target]
    assert not direct, f"the CLI imports backends directly: {direct}"


def unexplained_local_imports(text: str) -> list[int]:
    """The first lines of the function-local import blocks (consecutive import statements, in any
    block of a function) of `text` that no comment explains: on a line of the block or above it."""
    lines = text.splitlines()
    starts: set[int] = set()
    functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in (inner for function in functions for inner in ast.walk(function)):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):  # a lambda's or an if-expression's body is an expression
                continue
            block: list[ast.stmt] = []
            for stmt in [*stmts, None]:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    block.append(stmt)
                    continue
                if block:
                    first, last = block[0].lineno, block[-1].end_lineno or block[-1].lineno
                    above = lines[first - 2].lstrip().startswith("#")
                    if not (above or any("#" in lines[n - 1] for n in range(first, last + 1))):
                        starts.add(first)
                block = []
    return sorted(starts)


def test_every_function_local_import_says_why() -> None:
    """An import at the top is the rule; one inside a function (to keep a heavy or optional module
    off a path that does not need it, or to break a cycle) says which in a comment."""
    found = []
    for path in sorted((REPO / "dist_jobs").rglob("*.py")):
        found += [f"{path.relative_to(REPO)}:{n}" for n in unexplained_local_imports(path.read_text())]
    assert not found, "say why, or move to the top:\n" + "\n".join(found)
    example = "def f():\n    import json\n\n    return json\n\ndef g():\n    import yaml  # heavy\n"
    assert unexplained_local_imports(example) == [2]
    nested = "def h():\n    try:\n        import toml\n    except ImportError:\n        pass\n"
    assert unexplained_local_imports(nested) == [3]
