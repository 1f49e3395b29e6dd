"""The generated parts of the documentation site, made from the code at build time.

`docs/hooks.py` calls these from `mkdocs build`; each one reads the code it documents (the spec's
JSON Schema, the CLI's argparse parser, dist_jobs/constants.py, dist_jobs/errors.py), so a page
cannot drift from what the program does. Stdlib and dist-jobs' own torch-free modules only.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import shlex
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The spec's string types carry a "no control characters" pattern: noise in a table.
_PLAIN_TEXT = re.compile(r"^\^\[\^\\x00")


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
        default = "required" if key in node.get("required", []) else _code(json.dumps(prop.get("default")))
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


def type_of(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """A JSON Schema node as a short type: `int 1..4096`, `"srun" | "torchrun"`, `list of string`."""
    if "anyOf" in prop:
        return " or ".join(type_of(p, defs) for p in prop["anyOf"])
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    ref = _ref_name(prop)
    if ref:
        return f"{ref} (section)"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {type_of(prop.get('items', {}), defs)}"
    if kind == "object":
        keys = prop.get("propertyNames", {}).get("pattern")
        key_text = f"name matching `{_pattern(keys)}`" if keys else "string"
        return f"map of {key_text} to {type_of(prop.get('additionalProperties', {}), defs)}"
    return kind + _bounds(prop)


def _bounds(prop: dict[str, Any]) -> str:
    lo = prop.get("minimum", prop.get("exclusiveMinimum"))
    hi = prop.get("maximum", prop.get("exclusiveMaximum"))
    text = ""
    if lo is not None or hi is not None:
        left = "" if lo is None else f"{lo} {'<' if 'exclusiveMinimum' in prop else '<='} "
        right = "" if hi is None else f" {'<' if 'exclusiveMaximum' in prop else '<='} {hi}"
        text = f" ({left}x{right})"
    pattern = prop.get("pattern")
    if pattern and not _PLAIN_TEXT.match(pattern):
        text += f" matching `{_pattern(pattern)}`"
    return text


def _pattern(pattern: str) -> str:
    return pattern.removesuffix("(?![\\s\\S])").removesuffix("$") + "$"


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
    for verb in ("status", "cancel"):
        sub = sub_parser(verb)
        out.append(f"## `dist-jobs sweep {verb}`\n\n{sub.description}\n\n{_usage_block(sub)}\n\n{_options(sub)}")
    return "\n\n".join(x for x in out if x)


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
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
        rows.append(f"| {names} | {values} | {default} | {_cell(action.help or '')} |")
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


def _dedent(block: str) -> str:
    return "".join(line[4:] + "\n" for line in block.splitlines())


# Executed examples: a console block's `$ dist-jobs ...` lines run in a scratch folder holding the
# page's `title="FILE"` blocks; the printed output must match the block (a `...` line matches any
# lines).

_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)
_TITLE = re.compile(r'title="([^"]+)"')


def check_examples(markdown: str) -> list[str]:
    """Every mismatch between a page's console examples and what dist-jobs prints now."""
    files: dict[str, str] = {}
    problems: list[str] = []
    for lang, info, body in _FENCE.findall(markdown):
        title = _TITLE.search(info)
        if title:
            files[title.group(1)] = body
        elif lang == "console" and body.startswith("$ dist-jobs "):
            problems += _check_console(body, files)
    return problems


def _check_console(body: str, files: dict[str, str]) -> list[str]:
    problems = []
    for command, expected in _commands(body):
        printed = run_cli(shlex.split(command)[1:], files)
        if not matches(expected, printed):
            problems.append(f"`{command}` printed:\n{printed}\nbut the page shows:\n{expected}")
    return problems


def _commands(body: str) -> Iterator[tuple[str, str]]:
    chunks = re.split(r"^\$ ", body, flags=re.M)
    for chunk in chunks[1:]:
        command, _, output = chunk.partition("\n")
        yield command, output


def run_cli(argv: list[str], files: dict[str, str]) -> str:
    """`dist-jobs ARGV` in a scratch folder holding `files`: stderr and stdout as a terminal shows them."""
    from dist_jobs.cli import main

    buffer = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch, chdir(scratch):
        for name, text in files.items():
            Path(name).parent.mkdir(parents=True, exist_ok=True)
            Path(name).write_text(text)
        with redirect_stdout(buffer), redirect_stderr(buffer):
            try:
                main(argv)
            except SystemExit:  # argparse's own errors
                pass
    return buffer.getvalue()


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
    """`printed` equals `expected` line for line, where a `...` line stands for any lines."""
    pattern = "".join(r"(?:.*\n)*?" if line == "..." else re.escape(line) + r"\n" for line in expected.splitlines())
    return re.fullmatch(pattern, printed if printed.endswith("\n") else printed + "\n") is not None
