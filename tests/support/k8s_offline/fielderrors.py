"""The apiserver's field.Error, rendered the way kube-apiserver prints it, and the ObjectMeta rules.

A message from the offline validator should read exactly like one from a cluster, so the
helpers here copy apimachinery's formatting: `%#v` for maps and lists, JSON quoting for
strings, the DNS-1123/1035 and qualified-name regex messages verbatim.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DNS1035_LABEL",
    "UNKNOWN_FIELD",
    "FieldError",
    "forbidden",
    "go_syntax",
    "go_value",
    "invalid",
    "join_path",
    "json_type",
    "metadata_errors",
    "not_supported",
    "num",
    "required",
    "syntax",
]


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


UNKNOWN_FIELD = "UnknownField"  # not a field.Error type: the apiserver reports these at decode time


@dataclass(frozen=True)
class FieldError:
    """One apiserver field error. `reason` is the Status cause reason (FieldValueRequired, ...),
    `message` the error body ('Required value', 'Invalid value: "x": ...')."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        if self.reason == UNKNOWN_FIELD or not self.field:
            return self.message
        return f"{self.field}: {self.message}"


def num(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def go_syntax(value: Any) -> str:
    """fmt's %#v for a decoded JSON value, which the apiserver uses for maps and lists."""
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}:{go_syntax(value[k])}" for k in sorted(value))
        return "map[string]interface {}{" + inner + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(go_syntax(v) for v in value) + "}"
    return "interface {}(nil)" if value is None else go_value(value)


def go_value(value: Any) -> str:
    """How field.Error.ErrorBody prints a bad value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return num(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return go_syntax(value)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(field, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {detail}")


def required(field: str, detail: str = "") -> FieldError:
    return FieldError(field, "FieldValueRequired", f"Required value: {detail}" if detail else "Required value")


def not_supported(field: str, value: Any, allowed: list[str]) -> FieldError:
    shown = ", ".join(json.dumps(a) for a in allowed)
    body = f"Unsupported value: {go_value(value)}: supported values: {shown}"
    return FieldError(field, "FieldValueNotSupported", body)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError(field, "FieldValueForbidden", f"Forbidden: {detail}")


def json_type(value: Any) -> str:
    for kind, name in (
        (bool, "boolean"),
        (int, "integer"),
        (float, "number"),
        (str, "string"),
        (list, "array"),
        (dict, "object"),
    ):
        if isinstance(value, kind):
            return name
    return "null"


# --- ObjectMeta rules (k8s.io/apimachinery validation) -------------------------------------

_DNS1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?",
    ("my-name", "123-abc"),
)
_DNS1123_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character",
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
    ("example.com",),
)
DNS1035_LABEL = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character",
    r"[a-z]([-a-z0-9]*[a-z0-9])?",
    ("my-name", "abc-123"),
)
_QUALIFIED_NAME = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]",
    ("MyName", "my.name", "123-abc"),
)
_LABEL_VALUE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character",
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
    ("MyValue", "my_value", "12345"),
)


def _regex_error(rule: tuple[str, str, tuple[str, ...]]) -> str:
    message, regex, examples = rule
    shown = "".join(f"{' or ' if i else ''}'{example}', " for i, example in enumerate(examples))
    return f"{message} (e.g. {shown}regex used for validation is '{regex}')"


def syntax(value: str, rule: tuple[str, str, tuple[str, ...]], max_len: int) -> list[str]:
    errors = [f"must be no more than {max_len} characters"] if len(value) > max_len else []
    if not re.fullmatch(rule[1], value):
        dots = rule is _DNS1123_LABEL and re.fullmatch(_DNS1123_SUBDOMAIN[1], value)
        errors.append("must not contain dots" if dots else _regex_error(rule))
    return errors


def _qualified_name(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME)
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    errors = []
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + m for m in syntax(parts[0], _DNS1123_SUBDOMAIN, 253)]
    name = parts[-1]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not re.fullmatch(_QUALIFIED_NAME[1], name):
        errors.append("name part " + _regex_error(_QUALIFIED_NAME))
    return errors


def metadata_errors(meta: Any) -> list[FieldError]:
    """ValidateObjectMetaAccessor: name/generateName, namespace, labels, annotation keys."""
    meta = meta if isinstance(meta, dict) else {}
    errors: list[FieldError] = []
    for key in ("name", "generateName", "namespace"):  # the apiserver cannot even decode these
        if meta.get(key) is not None and not isinstance(meta[key], str):
            actual = json_type(meta[key])
            errors.append(
                FieldError(
                    f"metadata.{key}",
                    "FieldValueTypeInvalid",
                    f'Invalid value: "{actual}": metadata.{key} must be of type string',
                )
            )
    if errors:
        return errors
    name, generate = meta.get("name") or "", meta.get("generateName") or ""
    if generate:  # the trailing '-' is masked: a random suffix follows it
        masked = generate[:-1] + "a" if generate.endswith("-") else generate
        errors += [invalid("metadata.generateName", generate, m) for m in syntax(masked, _DNS1123_SUBDOMAIN, 253)]
    if not name and not generate:
        errors.append(required("metadata.name", "name or generateName is required"))
    elif name:
        errors += [invalid("metadata.name", name, m) for m in syntax(name, _DNS1123_SUBDOMAIN, 253)]
    if meta.get("namespace"):
        ns = meta["namespace"]
        errors += [invalid("metadata.namespace", ns, m) for m in syntax(ns, _DNS1123_LABEL, 63)]
    for key, value in (meta.get("labels") or {}).items():
        errors += [invalid("metadata.labels", key, m) for m in _qualified_name(str(key))]
        if not isinstance(value, str):
            errors.append(invalid("metadata.labels", value, "label values must be strings"))
            continue
        errors += [invalid("metadata.labels", value, m) for m in syntax(value, _LABEL_VALUE, 63)]
    for key in meta.get("annotations") or {}:
        errors += [invalid("metadata.annotations", key, m) for m in _qualified_name(str(key).lower())]
    return errors
