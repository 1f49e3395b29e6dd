"""Validate custom resources offline the way kube-apiserver does on CREATE.

jsonschema checks the CRD's openAPIV3Schema (k8s_schema). Around it sit the apiserver steps
jsonschema knows nothing about: unknown fields are *pruned*, not rejected, unless the client asks
for Strict; `default:`s are applied before validation (a port's `(containerPort, protocol)`
list-map key only collides once `protocol: TCP` is defaulted); ObjectMeta rules; the scale
subresource's replicas check. Errors read like the apiserver's field.Error strings
(k8s_fielderrors). CEL rules (x-kubernetes-validations) are not evaluated. admission_errors()
(k8s_webhook) adds the training-operator's PyTorchJob validating webhook.

yaml and jsonschema are imported inside functions: rendering must stay light.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from dist_jobs.errors import UsageError
from support.k8s_offline.crds import CRD_DIRS, CRD_FILES, CrdInfo, crd_info, crd_path
from support.k8s_offline.fielderrors import UNKNOWN_FIELD, FieldError, invalid, join_path, metadata_errors
from support.k8s_offline.schema import Compiled, compiled, schema_error
from support.k8s_offline.webhook import WEBHOOK_NAME, admission_errors

__all__ = [
    "CRD_DIRS",
    "CRD_FILES",
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

# Root metadata is decoded into ObjectMeta, whatever the CRD schema says: other keys are
# dropped (and reported as unknown fields), exactly like a typo under spec.
_OBJECT_META = frozenset(
    "name generateName namespace selfLink uid resourceVersion generation creationTimestamp "
    "deletionTimestamp deletionGracePeriodSeconds labels annotations ownerReferences "
    "finalizers managedFields".split()
)
_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
_MAX_INT32 = 2147483647


def _resolve(obj: Any, crd: Path | None) -> Compiled:
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
    return compiled(str(info.path), version)


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
                _prune(x[key], props[key], join_path(path, key), unknown)
            elif s is not None and extra not in (None, False):
                _prune(x[key], extra if isinstance(extra, dict) else None, join_path(path, key), unknown)
            elif not keep:
                unknown.append(join_path(path, key))
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


def _prune_and_default(obj: dict[str, Any], comp: Compiled) -> tuple[dict[str, Any], list[str]]:
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


def _type_meta_errors(obj: dict[str, Any], comp: Compiled) -> list[FieldError]:
    errors = []
    if obj.get("kind") != comp.info.kind:
        errors.append(invalid("kind", obj.get("kind", ""), f"must be {comp.info.kind}"))
    expected = comp.info.api_version(comp.version)
    if obj.get("apiVersion") != expected:
        errors.append(invalid("apiVersion", obj.get("apiVersion", ""), f"must be {expected}"))
    return errors


def _scale_errors(obj: dict[str, Any], comp: Compiled) -> list[FieldError]:
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
        go_type = {
            str: "string",
            float: "float64",
            bool: "bool",
            dict: "map[string]interface {}",
            list: "[]interface {}",
        }.get(type(node), type(node).__name__)
        shown = node if isinstance(node, str) else json.dumps(node)
        return [invalid(path, 0, f"{path} accessor error: {shown} is of the type {go_type}, expected int64")]
    if node < 0:
        return [invalid(path, node, "should be a non-negative integer")]
    if node > _MAX_INT32:
        return [invalid(path, node, f"should be less than or equal to {_MAX_INT32}")]
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
    errors += metadata_errors(stored.get("metadata"))
    schema_errors, list_errors = [], []
    for err in comp.validator.iter_errors(stored):
        converted = schema_error(err, comp.schema)
        (list_errors if err.validator == "x-kubernetes-list-type" else schema_errors).append(converted)
    return errors + schema_errors + _scale_errors(stored, comp) + list_errors
