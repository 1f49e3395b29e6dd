"""The generated parts of the documentation site, made from the code at build time.

`docs/hooks.py` calls these from `mkdocs build`; each one reads the code it documents (the spec's
JSON Schema, the CLI's argparse parser, dist_jobs/constants.py, dist_jobs/errors.py), so a page
cannot drift from what the program does. Stdlib, PyYAML and dist-jobs' own torch-free modules only.
"""

from __future__ import annotations

import argparse
import ast
import base64
import io
import json
import os
import re
import shlex
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, get_args

import yaml

from dist_jobs.cli.argv import subcommands

REPO = Path(__file__).resolve().parent.parent


# The job spec reference, from dist_jobs.spec.json_schema() (what `dist-jobs schema` prints).


def spec_reference() -> str:
    from dist_jobs.spec import json_schema

    schema = json_schema()
    defs = schema["$defs"]
    out = [_section_table("Top level", schema, defs)]
    for key, prop in schema["properties"].items():
        ref = _ref_name(prop)
        if ref:
            out.append(_section_table(f"`{key}:`", defs[ref], defs, prefix=f"{key}."))
    for name in sorted(defs):
        if name not in {_ref_name(p) for p in schema["properties"].values()} and name != "JobSpec":
            out.append(_section_table(f"`{name}` (an item of a list above)", defs[name], defs))
    return "\n\n".join(out)


def _section_table(title: str, node: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> str:
    lines = [f"### {title}", ""]
    if node.get("description"):
        lines += [node["description"], ""]
    lines += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for key, prop in sorted(node["properties"].items()):
        default = "required" if key in node.get("required", []) else _code(_yaml_value(prop.get("default")))
        if _ref_name(prop):
            default = f"see [`{prefix}{key}:`](#{_anchor(prefix + key)})" if not prefix else "see below"
        doc = _cell(prop.get("description", ""))
        lines.append(f"| `{prefix}{key}` | {_cell(type_of(prop, defs))} | {default} | {doc} |")
    return "\n".join(lines)


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", key.lower())


def _ref_name(prop: dict[str, Any]) -> str | None:
    ref = prop.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


_PLURAL = {"integer": "integers", "number": "numbers", "string": "strings", "boolean": "booleans", "any": "values"}


def type_of(prop: dict[str, Any], defs: dict[str, Any], plural: bool = False) -> str:
    """A JSON Schema node as a reader writes its type: `integer (1 to 4096)`, `one of: srun,
    torchrun`, `list of strings`, `mapping of variable name to string`; `plural` for a list's items."""
    if "anyOf" in prop:
        kinds = [p for p in prop["anyOf"] if p.get("type") != "null"]
        text = " or ".join(type_of(p, defs, plural) for p in kinds)
        return text + " or null" if len(kinds) < len(prop["anyOf"]) else text
    if "enum" in prop:
        return "one of: " + ", ".join(_code(_yaml_value(v)) for v in prop["enum"])
    ref = _ref_name(prop)
    if ref:
        return f"`{ref}` items" if plural else "section"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {type_of(prop.get('items', {}), defs, plural=True)}"
    if kind == "object":
        key = _string_kind(prop.get("propertyNames", {}), plural=False)
        return f"mapping of {key} to {type_of(prop.get('additionalProperties', {}), defs)}"
    if kind == "string":
        return _string_kind(prop, plural)
    return (_PLURAL[kind] if plural else kind) + _bounds(prop)


def _bounds(prop: dict[str, Any]) -> str:
    low = prop.get("minimum", prop.get("exclusiveMinimum"))
    high = prop.get("maximum", prop.get("exclusiveMaximum"))
    if low is not None and high is not None:
        return f" ({low} to {high})"
    if low is not None:
        return f" ({'above' if 'exclusiveMinimum' in prop else 'at least'} {low})"
    if high is not None:
        return f" ({'below' if 'exclusiveMaximum' in prop else 'at most'} {high})"
    return ""


def _string_kind(prop: dict[str, Any], plural: bool) -> str:
    """The words for a string type: its pattern (a spec type of dist_jobs.spec) by name, no regex."""
    pattern = prop.get("pattern")
    if pattern is None:
        return "strings" if plural else "string"
    kinds = _string_kinds()
    if pattern not in kinds:
        raise ValueError(f"the spec has a string type with no name in docs/gen.py (_string_kinds): {pattern!r}")
    return kinds[pattern][plural]


def _string_kinds() -> dict[str, tuple[str, str]]:
    """Each string type of the spec by its pattern: (singular, plural)."""
    from dist_jobs.spec import model, train, validate

    named = [
        (validate.Text, "string", "strings"),
        (model.Line, "one-line string", "one-line strings"),
        (model.ShellLine, "shell line", "shell lines"),
        (model.EnvName, "variable name", "variable names"),
        (model.Memory, "memory size (`64G`, `512M`)", "memory sizes"),
        (model.Quantity, "Kubernetes quantity (`8Gi`, `500m`)", "Kubernetes quantities"),
        (train.Importable, "name or `module:factory`", "names or `module:Class` references"),
        (train.RunName, "run name (letters, digits, `_.-`)", "run names"),
        (train.SignalName, "signal name or number", "signal names or numbers"),
    ]
    return {get_args(tp)[1].pattern: (one, many) for tp, one, many in named}


def _yaml_value(value: Any) -> str:
    """A default as it is written in job.yaml: `srun`, `null`, `[SIGUSR1, SIGTERM]`, `{}`."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and value and yaml.safe_load(value) == value and value.strip() == value:
        return value
    return json.dumps(value)


def _escape(text: str) -> str:
    """Prose from the parser: its `[--flag]` would read as Markdown link references."""
    return text.replace("[", "\\[").replace("]", "\\]")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


# The CLI reference, from dist_jobs.cli.parser.build() and the `sweep status`/`sweep cancel` parsers.


def cli_reference() -> str:
    from dist_jobs.cli.parser import build
    from dist_jobs.cli.sweep import sub_parser

    parser = build()
    out = [_usage_block(parser), parser.description or "", _escape(parser.epilog or "")]
    for name, sub in _subparsers(parser):
        out.append(f"## `dist-jobs {name}`\n\n{_help_of(parser, name)}\n\n{_usage_block(sub)}\n\n{_options(sub)}")
        if sub.epilog:
            out.append(_escape(sub.epilog))
        for action, inner in _subparsers(sub):  # `config show`: an action with its own arguments
            title = f"## `dist-jobs {name} {action}`\n\n{_help_of(sub, action)}"
            out.append(f"{title}\n\n{_usage_block(inner)}\n\n{_options(inner)}")
    for verb in ("status", "cancel"):
        sub = sub_parser(verb)
        out.append(f"## `dist-jobs sweep {verb}`\n\n{sub.description}\n\n{_usage_block(sub)}\n\n{_options(sub)}")
    return "\n\n".join(x for x in out if x)


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in subcommands(parser):
        yield from action.choices.items()


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in subcommands(parser):
        for choice in action._choices_actions:
            if choice.dest == name:
                return choice.help or ""
    return ""


def _usage_block(parser: argparse.ArgumentParser) -> str:
    # A fixed width: the terminal of whoever builds the site must not change the page.
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "76"
    try:
        usage = parser.format_usage().strip()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return "```text\n" + usage + "\n```"


def _options(parser: argparse.ArgumentParser) -> str:
    rows = ["| argument | values | default | description |", "| --- | --- | --- | --- |"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.metavar or action.dest}`"
        values = " \\| ".join(f"`{c}`" for c in action.choices) if action.choices else _metavar(action)
        default = "required" if action.required else _default(action)
        # as `--help` shows it: argparse's `%%` (its escape of a `%`) as `%`
        text = parser._get_formatter()._expand_help(action) if action.help else ""
        rows.append(f"| {names} | {values} | {default} | {_cell(text)} |")
    return "\n".join(rows)


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "(flag)"
    if action.type is not None:
        return getattr(action.type, "__name__", "value")
    return f"`{action.metavar}`" if isinstance(action.metavar, str) else "text"


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
        return ""
    return _code(str(action.default))


# Exit codes and errors, from dist_jobs/constants.py and dist_jobs/errors.py (their own comments).


def constants_table() -> str:
    """Every integer constant of dist_jobs/constants.py, with the comment written above it."""
    path = REPO / "dist_jobs" / "constants.py"
    source = path.read_text()
    lines = source.splitlines()
    rows = ["| constant | value | meaning |", "| --- | --- | --- |"]
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        value = ast.literal_eval(node.value)
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        rows.append(f"| `{node.targets[0].id}` | `{value}` | {_cell(_comment_above(lines, node.lineno))} |")
    return "\n".join(rows)


def _comment_above(lines: list[str], lineno: int) -> str:
    comment: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].startswith("#"):
        comment.insert(0, lines[i].lstrip("# "))
        i -= 1
    return " ".join(comment)


def error_classes() -> str:
    """Every typed error in dist_jobs/ (read from the source: the trainer's import torch), with its
    exit code and docstring."""
    found: dict[str, tuple[str, int | None, str, str]] = {}  # name: (base, exit code, doc, module)
    for path in sorted((REPO / "dist_jobs").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.bases and isinstance(node.bases[0], ast.Name):
                found[node.name] = (node.bases[0].id, _exit_code(node), ast.get_docstring(node) or "", module)
    rows = ["| error | where | exit code | what it means |", "| --- | --- | --- | --- |"]
    for name in sorted(found, key=lambda n: (found[n][3], n)):
        code = _inherited_code(name, found)
        if code is not None and found[name][2]:
            rows.append(f"| `{name}` | `{found[name][3]}` | {code} | {_cell(found[name][2])} |")
    return "\n".join(rows)


def _exit_code(node: ast.ClassDef) -> int | None:
    for item in node.body:
        if isinstance(item, ast.Assign) and getattr(item.targets[0], "id", "") == "exit_code":
            value = item.value
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                return value.value
            return _constant(getattr(value, "id", ""))
    return None


def _constant(name: str) -> int | None:
    from dist_jobs import constants

    value = getattr(constants, name, None)
    return value if isinstance(value, int) else None


def _inherited_code(name: str, found: dict[str, tuple[str, int | None, str, str]]) -> int | None:
    """The exit code of a DistJobsError subclass (its own or its nearest base's); None for others."""
    chain = []
    while name in found and name not in chain:
        chain.append(name)
        if name == "DistJobsError":
            break
        name = found[name][0]
    if "DistJobsError" not in chain:
        return None
    return next(found[n][1] for n in chain if found[n][1] is not None)


def docstring(relative: str) -> str:
    """A module's docstring, read without importing it (the trainer's modules import torch)."""
    text = ast.get_docstring(ast.parse((REPO / relative).read_text())) or ""
    # Indented lines are commands or formats: a code block, not a Markdown quote.
    return re.sub(r"((?:^    .*\n?)+)", lambda m: "\n```text\n" + _dedent(m.group(1)) + "```\n", text, flags=re.M)


def function(reference: str) -> str:
    """`FILE:NAME`: a module-level function's heading, signature and docstring, read from the
    source. For a function that mkdocstrings cannot reach: dist_jobs.api's verb `job()` shares its
    name with the submodule dist_jobs.api.job, which griffe files under that name instead."""
    relative, name = reference.split(":")
    tree = ast.parse((REPO / relative).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    module = ".".join(Path(relative).with_suffix("").parts).removesuffix(".__init__")
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    signature = f"{name}({ast.unparse(node.args)}){returns}"
    heading = f'<h2 id="{module}.{name}" class="doc doc-heading"><code>{module}.{name}</code></h2>'
    return f"{heading}\n\n```python\n{signature}\n```\n\n{ast.get_docstring(node) or ''}\n"


def _dedent(block: str) -> str:
    return "".join(line[4:] + "\n" for line in block.splitlines())


# Executed examples: a page's `$ dist-jobs ...` lines in `console` blocks run in order, in one
# scratch folder per page that holds the page's `title="FILE"` blocks, so a tutorial's commands see
# what the earlier ones left (a submitted job, its run directory). The printed output must match the
# block: a `...` line matches any lines, a `…` inside a line any text there (a time, a speed). The
# built page shows what was printed in place of each `…` line, so the site carries the real output.
# The scratch folder reads as SHOWN_FOLDER, on the page and in its commands. An image the commands
# wrote and the page shows (`![...](run.png)`) is embedded in the page.

_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)
_TITLE = re.compile(r'title="([^"]+)"')
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([\w.-]+\.png)\)")
SHOWN_FOLDER = "/home/me/tutorial"
ANY_TEXT = "\u2026"  # …


def check_examples(markdown: str) -> list[str]:
    """Every mismatch between a page's console examples and what dist-jobs prints now."""
    return run_examples(markdown)[1]


def run_examples(markdown: str) -> tuple[str, list[str]]:
    """The page with its examples' output as printed now, and every mismatch."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as scratch, chdir(scratch), home(os.path.realpath(scratch)):
        folder = os.path.realpath(scratch)

        def run_block(match: re.Match[str]) -> str:
            lang, info, body = match.groups()
            title = _TITLE.search(info)
            if title:
                _write(title.group(1), body)
            elif lang == "console" and body.startswith("$ dist-jobs "):
                body = _run_console(body, folder, problems)
            return f"```{lang}{info}\n{body}```"

        text = _FENCE.sub(run_block, markdown)
        text = _IMAGE.sub(_embed, text)
    return text, problems


def _run_console(body: str, folder: str, problems: list[str]) -> str:
    shown = []
    for command, expected in _commands(body):
        argv = shlex.split(command.replace(SHOWN_FOLDER, folder))[1:]
        printed = _run_here(argv).replace(folder, SHOWN_FOLDER)
        found = _match(expected, printed)
        if found is None:
            problems.append(f"`{command}` printed:\n{printed}\nbut the page shows:\n{expected}")
            found = expected
        shown.append(f"$ {command}\n{found}")
    return "".join(shown)


def _commands(body: str) -> Iterator[tuple[str, str]]:
    chunks = re.split(r"^\$ ", body, flags=re.M)
    for chunk in chunks[1:]:
        command, _, output = chunk.partition("\n")
        yield command, output


def _write(name: str, text: str) -> None:
    path = Path(os.path.expanduser(name))  # `~/.config/...`: in the page's home
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _embed(match: re.Match[str]) -> str:
    """An image the examples wrote, inline (a data: URI works from file:// and needs no copy in
    the site); one they did not write stays a link, which mkdocs --strict then reports."""
    path = Path(match.group(2))
    if not path.is_file():
        return match.group(0)
    return f"![{match.group(1)}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"


def run_cli(argv: list[str], files: dict[str, str]) -> str:
    """`dist-jobs ARGV` in a scratch folder holding `files`: stderr and stdout as a terminal shows them."""
    with tempfile.TemporaryDirectory() as scratch, chdir(scratch):
        for name, text in files.items():
            _write(name, text)
        return _run_here(argv)


def _run_here(argv: list[str]) -> str:
    from dist_jobs.cli import main

    buffer = io.StringIO()
    with redirect_stdout(buffer), redirect_stderr(buffer):
        try:
            main(argv)
        except SystemExit:  # argparse's own errors
            pass
    return buffer.getvalue()


@contextmanager
def home(folder: str) -> Iterator[None]:
    """`folder` as the home of a page's commands: a `~/...` file block lands there, and the
    builder's own config (its profiles) and record of submitted jobs stay out of the page's
    output. The cache stays the builder's (matplotlib's font list is not rebuilt per page)."""
    keep = {"XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")}
    given = {"HOME": folder, "XDG_CONFIG_HOME": f"{folder}/.config", "XDG_STATE_HOME": f"{folder}/.local/state"}
    with environ({**given, **keep}):
        yield


@contextmanager
def environ(given: dict[str, str]) -> Iterator[None]:
    """os.environ with `given` set, as it was again afterwards."""
    saved = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def chdir(path: str) -> Iterator[None]:
    """contextlib.chdir, which Python 3.10 lacks."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def matches(expected: str, printed: str) -> bool:
    """`printed` equals `expected` line for line, where a `...` line stands for any lines and a
    `…` inside a line for any text in that line."""
    return _match(expected, printed) is not None


def _match(expected: str, printed: str) -> str | None:
    """`expected` with each `…` line replaced by the line it matched; None if it does not match."""
    lines = expected.splitlines()
    pattern = "".join(_line_pattern(line) for line in lines)
    found = re.fullmatch(pattern, printed if printed.endswith("\n") else printed + "\n")
    if found is None:
        return None
    return "".join(f"{line}\n" if group is None else group for line, group in zip(lines, _groups(lines, found)))


def _line_pattern(line: str) -> str:
    if line == "...":
        return r"(?:.*\n)*?"
    if ANY_TEXT in line:
        return "(" + ".*".join(re.escape(part) for part in line.split(ANY_TEXT)) + r"\n)"
    return re.escape(line) + r"\n"


def _groups(lines: list[str], found: re.Match[str]) -> Iterator[str | None]:
    numbered = iter(found.groups())
    for line in lines:
        yield next(numbered) if line != "..." and ANY_TEXT in line else None
