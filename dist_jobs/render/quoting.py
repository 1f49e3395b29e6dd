"""Quoting filters: the only way a user value reaches a shell script or a YAML manifest.

The jinja environment registers these as filters and templates use them on every user value;
tests/unit/test_quoting_props.py proves the round trips with hypothesis.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import yaml


def sh(value: object) -> str:
    """One shell word that bash reads back as exactly `value`."""
    return shlex.quote(str(value))


def sh_argv(argv: list[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


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


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    # Double quotes: YAML 1.1 readers turn plain `no`, `0x1f` or `1e3` into bools and numbers;
    # a double-quoted scalar is always a string, escapes included. Multi-line text asks for a
    # literal block, which the emitter itself downgrades to double quotes when the text cannot
    # round-trip as one (trailing spaces, special characters).
    if "\n" in data.rstrip("\n"):
        style = "|"
    elif _PLAIN.fullmatch(data) and _RESOLVER.resolve(yaml.ScalarNode, data, (True, False)) == _STR_TAG:
        style = None  # reads back as this very string: keep it readable
    else:
        style = '"'
    return dumper.represent_scalar(_STR_TAG, data, style=style)


_STR_TAG = "tag:yaml.org,2002:str"
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_RESOLVER = yaml.resolver.Resolver()


_Dumper.add_representer(str, _str_presenter)


def yaml_value(value: Any) -> str:
    """A YAML flow value (scalar, list or mapping) on one line that safe_load reads back exactly."""
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, width=float("inf"), allow_unicode=False, explicit_end=False
    )
    text = text.rstrip("\n")
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text


def yaml_block(value: Any, indent: int) -> str:
    """Text to put right after `key:`: a scalar on the same line, or a block indented by `indent`."""
    if not isinstance(value, (dict, list)) or not value:
        return " " + yaml_value(value)
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=False, sort_keys=False, width=float("inf"), allow_unicode=False
    )
    pad = " " * indent
    return "\n" + "\n".join(pad + line if line else line for line in text.rstrip("\n").split("\n"))


def json_value(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def kubelet_literal(value: str) -> str:
    """A container env value, command or arg that reaches the process exactly as `value`: the
    kubelet turns `$(NAME)` into NAME's value and `$$` into `$` (Kubernetes'
    third_party/forked/golang/expansion/expand.go), so every `$` is written `$$`."""
    return value.replace("$", "$$")
