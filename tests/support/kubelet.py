"""What the kubelet does to a container's env, command and args before it starts the process.

Read off Kubernetes' own source:
* third_party/forked/golang/expansion/expand.go (`Expand`, `MappingFuncFor`): `$$` becomes `$`;
  `$(NAME)` becomes NAME's value when NAME is in the mapping, and stays `$(NAME)` when not; a `$`
  before any other character, a `$(` without `)` and a `$` at the very end stay as they are.
  v1.20 reads the character after `$` as one byte (a later release reads a rune); the two differ
  only for `$` followed by a non-ASCII character, which an escaped value never has.
* pkg/kubelet/kubelet_pods.go (`makeEnvironmentVariables`): env entries are resolved in order;
  a `value` is expanded against the entries before it (and the service variables, which these
  pods never refer to); a `valueFrom` is not expanded; a later entry of the same name wins.
* pkg/kubelet/container/helpers.go (`ExpandContainerCommandAndArgs`): each command and args
  element is expanded against the final environment.
* pkg/fieldpath (`ExtractFieldPathAsString`): the downward API's metadata.name, .namespace and
  `metadata.labels['k']` / `metadata.annotations['k']`, which are empty when the key is absent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """expansion.Expand(text, MappingFuncFor(mapping))."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_var, advance = _read_variable_name(text[cursor + 1 :])
            out.append((mapping[read] if read in mapping else f"$({read})") if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _read_variable_name(rest: str) -> tuple[str, bool, int]:
    """tryReadVariableName: (what was read, whether it names a variable, characters consumed)."""
    if rest[0] == "$":  # escaped operator
        return "$", False, 1
    if rest[0] == "(":
        closer = rest.find(")", 1)
        if closer != -1:
            return rest[1:closer], True, closer + 1
        return "$(", False, 1  # incomplete reference
    return "$" + rest[0], False, 1


_SUBSCRIPTED = re.compile(r"metadata\.(labels|annotations)\['(.*)'\]")


def field_ref(path: str, pod: Mapping[str, Any]) -> str:
    """A downward API fieldRef of the pod's metadata, or its node (podFieldSelectorRuntimeValue:
    spec.nodeName), as the kubelet gives them."""
    meta = pod["metadata"]
    if path in ("metadata.name", "metadata.namespace"):
        return str(meta.get(path.split(".")[1], ""))
    if path == "spec.nodeName":
        return str((pod.get("spec") or {}).get("nodeName", ""))
    match = _SUBSCRIPTED.fullmatch(path)
    if match is None:
        raise NotImplementedError(
            f"fieldRef {path!r}: only metadata name, namespace, labels and annotations and spec.nodeName are played"
        )
    return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))


def environment(env: list[dict[str, Any]], pod: Mapping[str, Any]) -> dict[str, str]:
    """makeEnvironmentVariables for one container's env list."""
    resolved: dict[str, str] = {}
    for item in env:
        if "value" in item:
            value = item["value"]
            resolved[item["name"]] = expand(value, resolved) if value else value
        elif "fieldRef" in (item.get("valueFrom") or {}):
            resolved[item["name"]] = field_ref(item["valueFrom"]["fieldRef"]["fieldPath"], pod)
        else:
            raise NotImplementedError(f"env {item['name']}: only values and metadata fieldRefs are played")
    return resolved


def argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """ExpandContainerCommandAndArgs: the process's argv."""
    return [expand(arg, env) for arg in [*container.get("command", []), *container.get("args", [])]]
