"""YAML input (the spec file, `--set` values) read so that no small input can hang, exhaust memory
or crash: regular files only, opened without blocking, at most 1 MiB of UTF-8; nesting and the
expansion of aliases bounded before anything walks the data; duplicate keys refused; `1:30:00`
stays text (YAML 1.1's base-60 numbers, which YAML 1.2 dropped, turned a time limit into 5400).

libyaml's parser (CSafeLoader) is used where installed: ten times faster than PyYAML's Python one,
but its composer recurses in C, so nesting is measured on the event stream first.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, NoReturn

import yaml

from dist_jobs.errors import MISSING, Problem, SpecError

MAX_BYTES = 1 << 20  # a job spec is a few KB; 1 MiB leaves room for generated ones
MAX_DEPTH = 32  # the spec nests 4 levels deep
MAX_VALUES = 100_000  # values after expanding aliases (a 1 KB alias bomb expands to billions)

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SAVE_IT = "save the spec to a file, then pass that file"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class SpecLoader(_Base):
    """SafeLoader without base-60 numbers, refusing a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` and keys that override it are meant to repeat
            key = (key_node.tag, key_node.value) if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key_node.value!r} is given twice in this mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
SpecLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def read_spec_file(path: Path) -> str:
    """The text of a spec file; a SpecError for anything but a readable regular UTF-8 file of <= 1 MiB."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            _refuse(
                path, "is not a regular file (a directory, FIFO or device)", "save the spec to a file, then pass it"
            )
        # O_NONBLOCK: had it become a FIFO since the check above, opening it must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                _refuse(path, "is not a regular file", _SAVE_IT)
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        _refuse(path, f"cannot read the file: {exc.strerror}", "check the path, or omit it to use flags only")
    if len(data) > MAX_BYTES:
        _refuse(path, f"is larger than {MAX_BYTES >> 20} MiB", "a job spec is a few KB: pass the right file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        _refuse(path, f"is not UTF-8 text (byte {data[exc.start]:#04x} on line {line})", "save the file as UTF-8")


def load_yaml(text: str, source: str) -> Any:
    """`text` as YAML data, or a SpecError naming `source` and where the problem is."""
    try:
        return parse_bounded(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        _refuse(source, f"is not valid YAML ({where}): {getattr(exc, 'problem', exc)}", "fix the YAML syntax there")


def parse_bounded(text: str, source: str) -> Any:
    """`text` as YAML data: yaml.YAMLError when it is not YAML, a SpecError when it is too big,
    too deep, or expands too far."""
    if len(text) > MAX_BYTES:
        _refuse(source, f"is larger than {MAX_BYTES >> 20} MiB", "give a smaller value")
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        _refuse(source, f"nests more than {MAX_DEPTH} levels deep", "a job spec nests 4 levels deep")
    data = yaml.load(text, Loader=SpecLoader)
    if _count(data, {}) > MAX_VALUES:
        _refuse(
            source,
            f"expands to more than {MAX_VALUES} values (YAML aliases that repeat other aliases)",
            "write the values out, or use fewer nested aliases",
        )
    return data


def _max_depth(text: str) -> int:
    depth = deepest = 0
    try:
        for event in yaml.parse(text, Loader=SpecLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
                if deepest > MAX_DEPTH:
                    break  # enough to refuse it; do not walk a million levels
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        # The libyaml of PyYAML 6.0.4's wheels scans ahead of the events it hands out and stops
        # at its own limit (1000 levels) before the first event comes back: deeper than ours too.
        if "nesting depth" not in str(getattr(exc, "problem", "")):
            raise
        return MAX_DEPTH + 1
    return deepest


def _count(data: Any, seen: dict[int, int]) -> int:
    """Values in `data` with every alias expanded; each shared object is counted once per use, walked once."""
    if not isinstance(data, (dict, list)):
        return 1
    if id(data) not in seen:
        seen[id(data)] = MAX_VALUES + 1  # until counted: a structure that contains itself is infinite
        items = [*data.keys(), *data.values()] if isinstance(data, dict) else data
        seen[id(data)] = min(MAX_VALUES + 1, 1 + sum(_count(item, seen) for item in items))
    return seen[id(data)]


def _refuse(where: str | Path, message: str, hint: str) -> NoReturn:
    raise SpecError([Problem(str(where), MISSING, message, hint)], str(where))
