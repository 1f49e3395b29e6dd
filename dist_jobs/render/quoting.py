"""Quoting filters: the only way a user value reaches a shell script or a YAML manifest.

The jinja environment registers these as filters and templates use them on every user value;
tests/unit/render/test_quoting_props.py proves the round trips with hypothesis.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shlex
from typing import Any

import yaml


def sh(value: object) -> str:
    """One bash word that bash reads back as exactly `value`, with no raw carriage return in it.

    sbatch refuses a whole script that holds CR LF anywhere ("DOS line breaks"), and a value
    ending in CR is one at the end of its line: text with a CR gets bash's $'...' quoting,
    where CR and LF are written as the escapes \\r and \\n.
    """
    text = str(value)
    if "\r" not in text:
        return shlex.quote(text)
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\r", "\\r").replace("\n", "\\n")
    return "$'" + escaped + "'"


def sh_argv(argv: list[str]) -> str:
    return " ".join(sh(a) for a in argv)


def sbatch_value(value: object) -> str:
    """A value on an `#SBATCH` line. sbatch's own parser treats a backslash as an escape even
    inside single quotes (checked on 22.05), so backslashes are doubled before shell quoting."""
    text = str(value)
    if text and all(c.isalnum() or c in "@%+=:,./-_" for c in text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "'\"'\"'") + "'"


def slurm_filename(path: str) -> str:
    """SLURM expands %-patterns in --output paths; a literal % must be written %%."""
    return path.replace("%", "%%")


# libyaml's emitter where PyYAML has it (4x faster than the Python one, same output rules), fed
# nodes built straight from the data: PyYAML's generic representer cost more than the emitting.
class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        # The emitter asks this twice per scalar; the answer depends on the arguments alone.
        if kind is not yaml.ScalarNode:
            return super().resolve(kind, value, implicit)
        return _resolve(value) if implicit[0] else _TAG["str"]  # quoted: always a string


_TAG = {name: f"tag:yaml.org,2002:{name}" for name in ("str", "int", "bool", "null", "map", "seq")}
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_RESOLVER = yaml.resolver.Resolver()
# YAML 1.1's whole boolean set (yaml.org/type/bool.html). Go's yaml.v2, which kubectl reads
# manifests with, uses it; PyYAML's resolver leaves out y, Y, n and N, so `ACCEPT_EULA=Y`
# would arrive as `true` after `kubectl apply`.
_YAML11_BOOL = re.compile(r"[yYnN]|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF")
_WIDTH = 1 << 30  # never fold a line: the emitter's own int, where float("inf") is Python-only


@functools.lru_cache(maxsize=8192)
def _resolve(value: str) -> str:
    """The tag a plain scalar `value` resolves to (PyYAML's YAML 1.1 rules)."""
    return _RESOLVER.resolve(yaml.ScalarNode, value, (True, False))


@functools.lru_cache(maxsize=8192)
def _style(data: str) -> str | None:
    """Plain only where every YAML 1.1 and 1.2 reader reads the very string back; a literal block
    for multi-line text (the emitter falls back to double quotes where one cannot round-trip);
    double quotes otherwise, which are a string in every version, escapes included."""
    if "\n" in data.rstrip("\n"):
        return "|"
    if _PLAIN.fullmatch(data) and not _YAML11_BOOL.fullmatch(data) and _resolve(data) == _TAG["str"]:
        return None
    return '"'


def _node(value: Any, flow: bool, sort: bool) -> yaml.Node:
    """What SafeDumper's representer makes of `value` (without anchors), our string styles included."""
    if isinstance(value, str):
        return yaml.ScalarNode(_TAG["str"], value, style=_style(value))
    if isinstance(value, bool):
        return yaml.ScalarNode(_TAG["bool"], "true" if value else "false")
    if isinstance(value, int):
        return yaml.ScalarNode(_TAG["int"], str(value))
    if value is None:
        return yaml.ScalarNode(_TAG["null"], "null")
    if isinstance(value, list):
        return yaml.SequenceNode(_TAG["seq"], [_node(v, flow, sort) for v in value], flow_style=flow)
    if isinstance(value, dict):
        items = list(value.items())
        if sort:
            with contextlib.suppress(TypeError):  # as PyYAML: unorderable keys keep their order
                items.sort(key=lambda kv: kv[0])
        pairs = [(_node(k, flow, sort), _node(v, flow, sort)) for k, v in items]
        return yaml.MappingNode(_TAG["map"], pairs, flow_style=flow)
    raise yaml.representer.RepresenterError(f"cannot represent an object: {value!r}")


def _emit(value: Any, flow: bool, sort: bool) -> str:
    node = _node(value, flow, sort)
    return yaml.serialize(node, Dumper=_Dumper, width=_WIDTH, allow_unicode=False, explicit_end=False)


def yaml_value(value: Any) -> str:
    """A YAML flow value (scalar, list or mapping) on one line that YAML 1.1 and 1.2 readers read back exactly."""
    if isinstance(value, str) and "\n" in value:  # a block scalar is no one-line value: its last break counts
        node = yaml.ScalarNode(_TAG["str"], value, style='"')
        return yaml.serialize(node, Dumper=_Dumper, width=_WIDTH, allow_unicode=False).rstrip("\n")
    text = _emit(value, flow=True, sort=True).rstrip("\n")
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text


def yaml_block(value: Any, indent: int) -> str:
    """Text to put right after `key:`: a scalar on the same line, or a block indented by `indent`."""
    if not isinstance(value, (dict, list)) or not value:
        return " " + yaml_value(value)
    text = _emit(value, flow=False, sort=False)
    pad = " " * indent
    # Only the document's own final newline goes: more would belong to a `|+` block scalar.
    return "\n" + "\n".join(pad + line if line else line for line in text.removesuffix("\n").split("\n"))


def kubelet_literal(value: str) -> str:
    """A container env value, command or arg that reaches the process exactly as `value`: the
    kubelet turns `$(NAME)` into NAME's value and `$$` into `$` (Kubernetes'
    third_party/forked/golang/expansion/expand.go), so every `$` is written `$$`."""
    return value.replace("$", "$$")


def torchrun_literal(word: str) -> str:
    """A word after torchrun's own flags that reaches the worker exactly as `word`: torchrun runs
    every worker arg through string.Template.safe_substitute(local_rank=...) (torch's
    distributed/elastic/utils/api.py `macros`), which turns `$$` into `$` and `${local_rank}` into
    the local rank, so every `$` is written `$$`."""
    return word.replace("$", "$$")
