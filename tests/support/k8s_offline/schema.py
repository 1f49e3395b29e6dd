"""A CRD's openAPIV3Schema as a jsonschema validator, and its errors as apiserver field errors.

jsonschema Draft 4 is the closest to OpenAPI 3.0 (boolean exclusiveMinimum). The OpenAPI-only
markers are rewritten (nullable, x-kubernetes-int-or-string) and two keywords are added:
x-kubernetes-list-type uniqueness and a `required` that puts the missing property into the error
path, as kube-openapi does. jsonschema is imported only when a validator is built or runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from support.k8s_offline.crds import CrdInfo, crd_doc, crd_info
from support.k8s_offline.fielderrors import (
    FieldError,
    go_syntax,
    go_value,
    invalid,
    join_path,
    json_type,
    not_supported,
    num,
    required,
)

__all__ = ["Compiled", "compiled", "schema_error"]

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions"})
_SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "additionalItems"})


# --- x-kubernetes-list-type and required, as jsonschema keywords -------------------------

_UNSET = object()


def _dup_indices(values: list[Any]) -> list[int]:
    """Index of each value's second occurrence (listtype.validateListSet reports only that)."""
    seen: dict[Any, int] = {}
    dups = []
    for i, value in enumerate(values):
        if value is _UNSET:
            key: Any = ("unset",)
        elif isinstance(value, (dict, list)):
            key = ("json", json.dumps(value, sort_keys=True))
        else:  # Go compares interface values: 1 (int64) and 1.0 (float64) differ
            key = ("scalar", type(value).__name__, value)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2:
            dups.append(i)
    return dups


def _list_violations(list_type: str, keys: list[str], items: list[Any]) -> list[tuple[int, str, str]]:
    if list_type == "set":
        return [(i, "FieldValueDuplicate", f"Duplicate value: {go_value(items[i])}") for i in _dup_indices(items)]
    if list_type != "map":
        return []
    for i, item in enumerate(items):
        if item is not None and not isinstance(item, dict):
            return [
                (
                    i,
                    "FieldValueInvalid",
                    f"Invalid value: {go_value(item)}: must be an object for an array of list-type map",
                )
            ]
    if len(keys) == 1:
        values = [item[keys[0]] if item and keys[0] in item else _UNSET for item in items]
        shown = [{} if v is _UNSET else {keys[0]: v} for v in values]
    else:
        values = shown = [{k: item[k] for k in keys if k in item} if item else {} for item in items]
    return [(i, "FieldValueDuplicate", f"Duplicate value: {go_syntax(shown[i])}") for i in _dup_indices(values)]


def _list_type_keyword(_validator: Any, list_type: str, instance: Any, schema: dict[str, Any]) -> Any:
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, list):
        return
    keys = schema.get("x-kubernetes-list-map-keys") or []
    for index, reason, body in _list_violations(list_type, keys, instance):
        error = ValidationError(body, path=[index])
        error.k8s_detail = (reason, body)  # type: ignore[attr-defined]
        yield error


def _required_keyword(_validator: Any, required: list[str], instance: Any, _schema: Any) -> Any:
    """Like Draft 4's, but the missing property goes into the error path, as the apiserver's."""
    from jsonschema.exceptions import ValidationError

    if isinstance(instance, dict):
        for prop in required:
            if prop not in instance:
                yield ValidationError(f"{prop!r} is a required property", path=[prop])


# --- jsonschema error -> field.Error -------------------------------------------------------


def _openapi_path(elems: Any) -> str:
    """kube-openapi's error name: map keys joined with '.', list indexes in brackets."""
    out = ""
    for el in elems:
        out = f"{out}[{el}]" if isinstance(el, int) else join_path(out, str(el))
    return out


def _field_path(schema: dict[str, Any], elems: Any) -> str:
    """field.Path's rendering, which puts additionalProperties keys in brackets."""
    out, node = "", schema
    for el in elems:
        if isinstance(el, int):
            out, node = f"{out}[{el}]", node.get("items") if isinstance(node.get("items"), dict) else {}
        elif el in node.get("properties", {}):
            out, node = join_path(out, el), node["properties"][el]
        else:
            extra = node.get("additionalProperties")
            out, node = f"{out}[{el}]", extra if isinstance(extra, dict) else {}
    return out


def _openapi_detail(kw: str, want: Any, inst: Any, schema: dict[str, Any]) -> tuple[Any, str] | None:
    """(bad value, detail after '<path> in body ') for kube-openapi's plain Invalid errors."""
    if kw == "pattern":
        return inst, f"should match '{want}'"
    if kw == "minLength":
        return inst, f"should be at least {want} chars long"
    if kw in ("minItems", "minProperties"):
        return len(inst), f"should have at least {want} {'items' if kw == 'minItems' else 'properties'}"
    if kw in ("minimum", "maximum"):
        exclusive = schema.get("exclusiveMinimum" if kw == "minimum" else "exclusiveMaximum")
        word = "greater" if kw == "minimum" else "less"
        return inst, f"should be {word} than{'' if exclusive else ' or equal to'} {num(want)}"
    if kw == "multipleOf":
        return inst, f"should be a multiple of {num(want)}"
    if kw == "uniqueItems":
        return "", "shouldn't contain duplicates"
    return None


def schema_error(err: Any, schema: dict[str, Any]) -> FieldError:
    kw, inst, want = err.validator, err.instance, err.validator_value
    path = _openapi_path(err.absolute_path)
    if kw == "x-kubernetes-list-type":
        reason, body = err.k8s_detail
        return FieldError(_field_path(schema, err.absolute_path), reason, body)
    if kw == "required":
        return required(path)
    if kw == "type" or (kw == "anyOf" and err.schema.get("x-kubernetes-int-or-string")):
        types = ["integer", "string"] if kw == "anyOf" else [want] if isinstance(want, str) else want
        actual, expected = json_type(inst), ",".join(t for t in types if t != "null")
        body = f'Invalid value: "{actual}": {path} in body must be of type {expected}: "{actual}"'
        return FieldError(path, "FieldValueTypeInvalid", body)
    if kw == "enum":
        return not_supported(path, inst, [v if isinstance(v, str) else json.dumps(v) for v in want])
    if kw == "maxLength":
        return FieldError(path, "FieldValueTooLong", f"Too long: may not be more than {want} bytes")
    if kw in ("maxItems", "maxProperties"):
        return FieldError(path, "FieldValueTooMany", f"Too many: {len(inst)}: must have at most {want} items")
    detail = _openapi_detail(kw, want, inst, err.schema)
    if detail is None:
        return invalid(path, "", err.message)
    return invalid(path, detail[0], f"{path} in body {detail[1]}")


def to_jsonschema(node: dict[str, Any]) -> dict[str, Any]:
    """Drop descriptions and spell OpenAPI-only markers in words jsonschema understands."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key in _SCHEMA_MAPS:  # keys here are field names, one may well be "description"
            out[key] = {name: to_jsonschema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [to_jsonschema(sub) for sub in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = to_jsonschema(value)
        else:
            out[key] = value
    if out.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def make_validator(schema: dict[str, Any]) -> Any:
    from jsonschema import Draft4Validator, validators

    def is_integer(_checker: Any, value: Any) -> bool:  # Go accepts 2.0 where an integer is due
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())

    checker = Draft4Validator.TYPE_CHECKER.redefine("integer", is_integer)
    cls = validators.extend(
        Draft4Validator,
        {"x-kubernetes-list-type": _list_type_keyword, "required": _required_keyword},
        type_checker=checker,
    )
    return cls(schema)


@dataclass(frozen=True)
class Compiled:
    """One CRD version ready to validate; loading and compiling it costs ~0.7 s, hence the cache below."""

    info: CrdInfo
    version: str
    schema: dict[str, Any]
    validator: Any
    scale_path: str | None
    drops_status: bool


@lru_cache(maxsize=16)
def compiled(path: str, version: str) -> Compiled:
    doc = crd_doc(path)
    entry = next(v for v in doc["spec"]["versions"] if v["name"] == version)
    schema = to_jsonschema(entry.get("schema", {}).get("openAPIV3Schema", {}))
    subresources = entry.get("subresources") or {}
    scale = subresources.get("scale") or {}
    return Compiled(
        info=crd_info(Path(path)),
        version=version,
        schema=schema,
        validator=make_validator(schema),
        scale_path=scale.get("specReplicasPath"),
        drops_status="status" in subresources,
    )
