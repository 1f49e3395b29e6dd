"""Validate custom resources offline the way kube-apiserver does on CREATE.

jsonschema (Draft 4, the closest to OpenAPI 3.0) checks the CRD's openAPIV3Schema. Around it
sit the apiserver steps jsonschema knows nothing about: unknown fields are *pruned*, not
rejected, unless the client asks for Strict; `default:`s are applied before validation (a
port's `(containerPort, protocol)` list-map key only collides once `protocol: TCP` is
defaulted); x-kubernetes-list-type uniqueness; ObjectMeta rules; the scale subresource's
replicas check. Errors are rendered like the apiserver's field.Error strings so a message
from here reads the same as one from a cluster. CEL rules (x-kubernetes-validations) are not
evaluated. admission_errors() adds the training-operator's PyTorchJob validating webhook.

yaml and jsonschema are imported inside functions: rendering must stay light.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dist_jobs.errors import DistJobsError, UsageError

__all__ = [
    "UNKNOWN_FIELD",
    "WEBHOOK_NAME",
    "CrdInfo",
    "FieldError",
    "admission_errors",
    "crd_info",
    "crd_path",
    "prune_and_default",
    "validate",
]

CRD_DIR = Path(__file__).resolve().parent.parent / "k8s" / "crds"
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
}
# Root metadata is decoded into ObjectMeta, whatever the CRD schema says: other keys are
# dropped (and reported as unknown fields), exactly like a typo under spec.
_OBJECT_META = frozenset(
    "name generateName namespace selfLink uid resourceVersion generation creationTimestamp "
    "deletionTimestamp deletionGracePeriodSeconds labels annotations ownerReferences "
    "finalizers managedFields".split()
)
_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions"})
_SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf"})
_SCHEMA_ONE = frozenset({"items", "additionalProperties", "not", "additionalItems"})
_MAX_INT32 = 2147483647


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


def _num(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _go_syntax(value: Any) -> str:
    """fmt's %#v for a decoded JSON value, which the apiserver uses for maps and lists."""
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}:{_go_syntax(value[k])}" for k in sorted(value))
        return "map[string]interface {}{" + inner + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_syntax(v) for v in value) + "}"
    return "interface {}(nil)" if value is None else _go_value(value)


def _go_value(value: Any) -> str:
    """How field.Error.ErrorBody prints a bad value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _num(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return _go_syntax(value)


def _invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(field, "FieldValueInvalid", f"Invalid value: {_go_value(value)}: {detail}")


def _required(field: str, detail: str = "") -> FieldError:
    return FieldError(field, "FieldValueRequired", f"Required value: {detail}" if detail else "Required value")


def _not_supported(field: str, value: Any, allowed: list[str]) -> FieldError:
    shown = ", ".join(json.dumps(a) for a in allowed)
    body = f"Unsupported value: {_go_value(value)}: supported values: {shown}"
    return FieldError(field, "FieldValueNotSupported", body)


def _forbidden(field: str, detail: str) -> FieldError:
    return FieldError(field, "FieldValueForbidden", f"Forbidden: {detail}")


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
        return [(i, "FieldValueDuplicate", f"Duplicate value: {_go_value(items[i])}") for i in _dup_indices(items)]
    if list_type != "map":
        return []
    for i, item in enumerate(items):
        if item is not None and not isinstance(item, dict):
            return [(i, "FieldValueInvalid",
                     f"Invalid value: {_go_value(item)}: must be an object for an array of list-type map")]
    if len(keys) == 1:
        values = [item[keys[0]] if item and keys[0] in item else _UNSET for item in items]
        shown = [{} if v is _UNSET else {keys[0]: v} for v in values]
    else:
        values = shown = [{k: item[k] for k in keys if k in item} if item else {} for item in items]
    return [(i, "FieldValueDuplicate", f"Duplicate value: {_go_syntax(shown[i])}") for i in _dup_indices(values)]


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
        out = f"{out}[{el}]" if isinstance(el, int) else _join(out, str(el))
    return out


def _field_path(schema: dict[str, Any], elems: Any) -> str:
    """field.Path's rendering, which puts additionalProperties keys in brackets."""
    out, node = "", schema
    for el in elems:
        if isinstance(el, int):
            out, node = f"{out}[{el}]", node.get("items") if isinstance(node.get("items"), dict) else {}
        elif el in node.get("properties", {}):
            out, node = _join(out, el), node["properties"][el]
        else:
            extra = node.get("additionalProperties")
            out, node = f"{out}[{el}]", extra if isinstance(extra, dict) else {}
    return out


def _json_type(value: Any) -> str:
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                       (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "null"


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
        return inst, f"should be {word} than{'' if exclusive else ' or equal to'} {_num(want)}"
    if kw == "multipleOf":
        return inst, f"should be a multiple of {_num(want)}"
    if kw == "uniqueItems":
        return "", "shouldn't contain duplicates"
    return None


def _schema_error(err: Any, schema: dict[str, Any]) -> FieldError:
    kw, inst, want = err.validator, err.instance, err.validator_value
    path = _openapi_path(err.absolute_path)
    if kw == "x-kubernetes-list-type":
        reason, body = err.k8s_detail
        return FieldError(_field_path(schema, err.absolute_path), reason, body)
    if kw == "required":
        return _required(path)
    if kw == "type" or (kw == "anyOf" and err.schema.get("x-kubernetes-int-or-string")):
        types = ["integer", "string"] if kw == "anyOf" else [want] if isinstance(want, str) else want
        actual, expected = _json_type(inst), ",".join(t for t in types if t != "null")
        body = f'Invalid value: "{actual}": {path} in body must be of type {expected}: "{actual}"'
        return FieldError(path, "FieldValueTypeInvalid", body)
    if kw == "enum":
        return _not_supported(path, inst, [v if isinstance(v, str) else json.dumps(v) for v in want])
    if kw == "maxLength":
        return FieldError(path, "FieldValueTooLong", f"Too long: may not be more than {want} bytes")
    if kw in ("maxItems", "maxProperties"):
        return FieldError(path, "FieldValueTooMany", f"Too many: {len(inst)}: must have at most {want} items")
    detail = _openapi_detail(kw, want, inst, err.schema)
    if detail is None:
        return _invalid(path, "", err.message)
    return _invalid(path, detail[0], f"{path} in body {detail[1]}")


# --- ObjectMeta rules (k8s.io/apimachinery validation) -------------------------------------

_DNS1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", ("my-name", "123-abc"))
_DNS1123_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character",
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", ("example.com",))
_DNS1035_LABEL = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character",
    r"[a-z]([-a-z0-9]*[a-z0-9])?", ("my-name", "abc-123"))
_QUALIFIED_NAME = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character",
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", ("MyName", "my.name", "123-abc"))
_LABEL_VALUE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character",
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", ("MyValue", "my_value", "12345"))


def _regex_error(rule: tuple[str, str, tuple[str, ...]]) -> str:
    message, regex, examples = rule
    shown = "".join(f"{' or ' if i else ''}'{example}', " for i, example in enumerate(examples))
    return f"{message} (e.g. {shown}regex used for validation is '{regex}')"


def _syntax(value: str, rule: tuple[str, str, tuple[str, ...]], max_len: int) -> list[str]:
    errors = [f"must be no more than {max_len} characters"] if len(value) > max_len else []
    if not re.fullmatch(rule[1], value):
        dots = rule is _DNS1123_LABEL and re.fullmatch(_DNS1123_SUBDOMAIN[1], value)
        errors.append("must not contain dots" if dots else _regex_error(rule))
    return errors


def _qualified_name(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) > 2:
        return ["a qualified name " + _regex_error(_QUALIFIED_NAME)
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    errors = []
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + m for m in _syntax(parts[0], _DNS1123_SUBDOMAIN, 253)]
    name = parts[-1]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not re.fullmatch(_QUALIFIED_NAME[1], name):
        errors.append("name part " + _regex_error(_QUALIFIED_NAME))
    return errors


def _metadata_errors(meta: Any) -> list[FieldError]:
    """ValidateObjectMetaAccessor: name/generateName, namespace, labels, annotation keys."""
    meta = meta if isinstance(meta, dict) else {}
    errors: list[FieldError] = []
    for key in ("name", "generateName", "namespace"):  # the apiserver cannot even decode these
        if meta.get(key) is not None and not isinstance(meta[key], str):
            actual = _json_type(meta[key])
            errors.append(FieldError(f"metadata.{key}", "FieldValueTypeInvalid",
                                     f'Invalid value: "{actual}": metadata.{key} must be of type string'))
    if errors:
        return errors
    name, generate = meta.get("name") or "", meta.get("generateName") or ""
    if generate:  # the trailing '-' is masked: a random suffix follows it
        masked = generate[:-1] + "a" if generate.endswith("-") else generate
        errors += [_invalid("metadata.generateName", generate, m) for m in _syntax(masked, _DNS1123_SUBDOMAIN, 253)]
    if not name and not generate:
        errors.append(_required("metadata.name", "name or generateName is required"))
    elif name:
        errors += [_invalid("metadata.name", name, m) for m in _syntax(name, _DNS1123_SUBDOMAIN, 253)]
    if meta.get("namespace"):
        ns = meta["namespace"]
        errors += [_invalid("metadata.namespace", ns, m) for m in _syntax(ns, _DNS1123_LABEL, 63)]
    for key, value in (meta.get("labels") or {}).items():
        errors += [_invalid("metadata.labels", key, m) for m in _qualified_name(str(key))]
        if not isinstance(value, str):
            errors.append(_invalid("metadata.labels", value, "label values must be strings"))
            continue
        errors += [_invalid("metadata.labels", value, m) for m in _syntax(value, _LABEL_VALUE, 63)]
    for key in meta.get("annotations") or {}:
        errors += [_invalid("metadata.annotations", key, m) for m in _qualified_name(str(key).lower())]
    return errors


@dataclass(frozen=True)
class CrdInfo:
    """Names a client needs to address a CRD's objects (CustomObjectsApi arguments)."""

    path: Path
    group: str
    kind: str
    plural: str
    singular: str
    list_kind: str
    namespaced: bool
    versions: tuple[str, ...]
    storage_version: str

    def api_version(self, version: str | None = None) -> str:
        return f"{self.group}/{version or self.storage_version}"


@dataclass(frozen=True)
class _Compiled:
    info: CrdInfo
    version: str
    schema: dict[str, Any]
    validator: Any
    scale_path: str | None
    drops_status: bool


def crd_path(kind: str) -> Path:
    """The vendored CRD file for `kind` (PyTorchJob, TrainJob or JobSet)."""
    name = CRD_FILES.get(kind)
    if name is None:
        raise UsageError(
            f"kind {kind!r} has no vendored CRD",
            hint=f"use one of {', '.join(CRD_FILES)} or pass crd=<path to a CRD YAML>",
        )
    path = CRD_DIR / name
    if not path.is_file():
        raise DistJobsError(
            f"the vendored CRD for {kind} is missing: {path}",
            hint="k8s/crds/ ships with the source tree; run from a full checkout or pass crd=",
        )
    return path


@lru_cache(maxsize=8)
def _crd_doc(path: str) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=loader)
    except (OSError, yaml.YAMLError) as exc:
        raise DistJobsError(f"cannot read CRD {path}: {exc}", hint="pass a readable CRD YAML") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
        raise DistJobsError(f"{path} is not a CustomResourceDefinition", hint="pass a CRD YAML file")
    return doc


@lru_cache(maxsize=16)
def crd_info(crd: Path) -> CrdInfo:
    """Group, kind, plural and versions of the CRD at `crd` (parsed once per path)."""
    path = Path(crd).resolve()
    spec = _crd_doc(str(path))["spec"]
    names = spec["names"]
    versions = tuple(v["name"] for v in spec["versions"] if v.get("served", True))
    storage = next((v["name"] for v in spec["versions"] if v.get("storage")), versions[0])
    return CrdInfo(
        path=path,
        group=spec["group"],
        kind=names["kind"],
        plural=names["plural"],
        singular=names.get("singular", names["kind"].lower()),
        list_kind=names.get("listKind", names["kind"] + "List"),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        versions=versions,
        storage_version=storage,
    )


def _to_jsonschema(node: dict[str, Any]) -> dict[str, Any]:
    """Drop descriptions and spell OpenAPI-only markers in words jsonschema understands."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key in _SCHEMA_MAPS:  # keys here are field names, one may well be "description"
            out[key] = {name: _to_jsonschema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [_to_jsonschema(sub) for sub in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = _to_jsonschema(value)
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


def _make_validator(schema: dict[str, Any]) -> Any:
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


@lru_cache(maxsize=16)
def _compiled(path: str, version: str) -> _Compiled:
    doc = _crd_doc(path)
    entry = next(v for v in doc["spec"]["versions"] if v["name"] == version)
    schema = _to_jsonschema(entry.get("schema", {}).get("openAPIV3Schema", {}))
    subresources = entry.get("subresources") or {}
    scale = subresources.get("scale") or {}
    return _Compiled(
        info=crd_info(Path(path)),
        version=version,
        schema=schema,
        validator=_make_validator(schema),
        scale_path=scale.get("specReplicasPath"),
        drops_status="status" in subresources,
    )


def _resolve(obj: Any, crd: Path | None) -> _Compiled:
    if not isinstance(obj, dict):
        raise UsageError(
            f"a Kubernetes object must be a mapping, got {type(obj).__name__}",
            hint="pass the parsed YAML/JSON document (a dict)",
        )
    path = Path(crd) if crd is not None else crd_path(str(obj.get("kind")))
    info = crd_info(path)
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    if group != info.group or version not in info.versions:
        version = info.storage_version  # the mismatch itself is reported by validate()
    return _compiled(str(info.path), version)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _prune(x: Any, s: dict[str, Any] | None, path: str, unknown: list[str]) -> None:
    """Port of apiextensions' structural pruning: drop what the schema does not name."""
    keep = bool(s and s.get("x-kubernetes-preserve-unknown-fields"))
    embedded = bool(s and s.get("x-kubernetes-embedded-resource"))
    if isinstance(x, dict):
        props = (s or {}).get("properties", {})
        extra = (s or {}).get("additionalProperties")
        for key in list(x):
            if embedded and key in _META_FIELDS:
                continue
            if key in props:
                _prune(x[key], props[key], _join(path, key), unknown)
            elif s is not None and extra not in (None, False):
                _prune(x[key], extra if isinstance(extra, dict) else None, _join(path, key), unknown)
            elif not keep:
                unknown.append(_join(path, key))
                del x[key]
    elif isinstance(x, list):
        items = (s or {}).get("items")
        for i, value in enumerate(x):
            _prune(value, items if isinstance(items, dict) else None, f"{path}[{i}]", unknown)


def _child(s: dict[str, Any], key: str) -> dict[str, Any] | None:
    if key in s.get("properties", {}):
        return s["properties"][key]
    extra = s.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _drop_nulls(x: Any, s: dict[str, Any] | None) -> None:
    """A null in a non-nullable field without a default is dropped, as the apiserver does."""
    if not isinstance(s, dict):
        return
    if isinstance(x, dict):
        for key in list(x):
            sub = _child(s, key)
            if sub is None:
                continue
            if x[key] is None and "default" not in sub and not sub.get("nullable"):
                del x[key]
            else:
                _drop_nulls(x[key], sub)
    elif isinstance(x, list):
        for value in x:
            _drop_nulls(value, s.get("items"))


def _default(x: Any, s: dict[str, Any] | None) -> None:
    if not isinstance(s, dict):
        return
    if isinstance(x, dict):
        for key, prop in s.get("properties", {}).items():
            if prop.get("default") is None:
                continue
            if key not in x or (x[key] is None and not prop.get("nullable")):
                x[key] = copy.deepcopy(prop["default"])
        for key, value in x.items():
            _default(value, _child(s, key))
    elif isinstance(x, list):
        for value in x:
            _default(value, s.get("items"))


def _prune_and_default(obj: dict[str, Any], comp: _Compiled) -> tuple[dict[str, Any], list[str]]:
    out = copy.deepcopy(obj)
    unknown: list[str] = []
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for key in [k for k in meta if k not in _OBJECT_META]:
            unknown.append(f"metadata.{key}")
            del meta[key]
    _prune(out, {**comp.schema, "x-kubernetes-embedded-resource": True}, "", unknown)
    if comp.drops_status:  # the status subresource owns it; CREATE never stores a status
        out.pop("status", None)
    _drop_nulls(out, comp.schema)
    _default(out, comp.schema)
    return out, sorted(unknown)


def prune_and_default(obj: dict[str, Any], crd: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """The object as the apiserver would store it on CREATE, and the unknown field paths it dropped."""
    return _prune_and_default(obj, _resolve(obj, crd))


def _type_meta_errors(obj: dict[str, Any], comp: _Compiled) -> list[FieldError]:
    errors = []
    if obj.get("kind") != comp.info.kind:
        errors.append(_invalid("kind", obj.get("kind", ""), f"must be {comp.info.kind}"))
    expected = comp.info.api_version(comp.version)
    if obj.get("apiVersion") != expected:
        errors.append(_invalid("apiVersion", obj.get("apiVersion", ""), f"must be {expected}"))
    return errors


def _scale_errors(obj: dict[str, Any], comp: _Compiled) -> list[FieldError]:
    """The scale subresource reads specReplicasPath as int64 even on CREATE."""
    if not comp.scale_path:
        return []
    node: Any = obj
    for part in comp.scale_path.lstrip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return []
        node = node[part]
    path = comp.scale_path
    if not isinstance(node, int) or isinstance(node, bool):
        go_type = {str: "string", float: "float64", bool: "bool", dict: "map[string]interface {}",
                   list: "[]interface {}"}.get(type(node), type(node).__name__)
        shown = node if isinstance(node, str) else json.dumps(node)
        return [_invalid(path, 0, f"{path} accessor error: {shown} is of the type {go_type}, expected int64")]
    if node < 0:
        return [_invalid(path, node, "should be a non-negative integer")]
    if node > _MAX_INT32:
        return [_invalid(path, node, f"should be less than or equal to {_MAX_INT32}")]
    return []


def validate(obj: dict[str, Any], crd: Path | None = None, *, strict: bool = True) -> list[FieldError]:
    """Every error the apiserver's CREATE would report for `obj` (empty list = accepted).

    `crd` defaults to the vendored CRD for obj["kind"]. strict=True also reports fields the
    apiserver would silently prune (what `fieldValidation=Strict` turns into a 400).
    """
    comp = _resolve(obj, crd)
    errors = _type_meta_errors(obj, comp)
    if errors:  # the apiserver stops here too
        return errors
    stored, unknown = _prune_and_default(obj, comp)
    if strict:
        errors += [FieldError(p, UNKNOWN_FIELD, f'unknown field "{p}"') for p in unknown]
    errors += _metadata_errors(stored.get("metadata"))
    schema_errors, list_errors = [], []
    for err in comp.validator.iter_errors(stored):
        converted = _schema_error(err, comp.schema)
        (list_errors if err.validator == "x-kubernetes-list-type" else schema_errors).append(converted)
    return errors + schema_errors + _scale_errors(stored, comp) + list_errors



# --- the training-operator's validating webhook (kubeflow/trainer v1.9.x) ------------------

WEBHOOK_NAME = "validator.pytorchjob.training-operator.kubeflow.org"
_MANAGED_BY = ["kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"]
_REPLICA_TYPES = ["Master", "Worker"]


def _replica_errors(rtype: str, rspec: Any) -> list[FieldError]:
    role = f"spec.pytorchReplicaSpecs[{rtype}]"
    containers_path = f"{role}.template.spec.containers"
    errors = [] if rtype in _REPLICA_TYPES else [_not_supported(role, rtype, _REPLICA_TYPES)]
    rspec = rspec if isinstance(rspec, dict) else {}
    containers = ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        errors.append(_required(containers_path, "must be specified"))
    for i, container in enumerate(c if isinstance(c, dict) else {} for c in containers):
        if not container.get("image"):
            errors.append(_required(f"{containers_path}[{i}].image", "must be required"))
    if not any(isinstance(c, dict) and c.get("name") == "pytorch" for c in containers):
        errors.append(_required(containers_path, "must have at least one container with name pytorch"))
    replicas = rspec.get("replicas")
    if rtype == "Master" and replicas != 1:  # unset counts as wrong: the webhook sees no defaults
        errors.append(_forbidden(f"{role}.replicas", "must be 1"))
    elif rtype != "Master" and isinstance(replicas, int) and replicas < 1:
        errors.append(_forbidden(f"{role}.replicas", "must be at least 1"))
    return errors


def admission_errors(obj: dict[str, Any]) -> list[str]:
    """What the PyTorchJob validating webhook denies, one apiserver-style string per problem.

    The apiserver answers 403 with f'admission webhook "{WEBHOOK_NAME}" denied the request: '
    followed by these (one bare, several as "[e1, e2]").
    """
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    errors: list[FieldError] = []
    name = str(meta.get("name") or "")
    problems = _syntax(name, _DNS1035_LABEL, 63)
    if problems:
        errors.append(_invalid("metadata.name", name, "should match: " + ",".join(problems)))
    managed_by = (spec.get("runPolicy") or {}).get("managedBy")
    if managed_by is not None and managed_by not in _MANAGED_BY:
        errors.append(_not_supported("spec.runPolicy.managedBy", managed_by, _MANAGED_BY))
    specs = spec.get("pytorchReplicaSpecs")
    elastic = spec.get("elasticPolicy")
    if isinstance(elastic, dict):
        if not isinstance(specs, dict) or "Worker" not in specs:
            errors.append(_required("spec.pytorchReplicaSpecs[Worker]", "must be configured if elastic policy is used"))
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append(_forbidden("spec.elasticPolicy.nProcPerNode", "must not be used with spec.nprocPerNode"))
    if specs is None:
        errors.append(_required("spec.pytorchReplicaSpecs", "must be required"))
    for rtype, rspec in (specs or {}).items() if isinstance(specs, dict) else ():
        errors += _replica_errors(str(rtype), rspec)
    return [str(e) for e in errors]
