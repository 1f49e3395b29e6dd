"""Every field of the job spec says what it does: the JSON Schema (`dist-jobs schema`, what editors
show on hover) and the spec reference page are made from these descriptions."""

from __future__ import annotations

from typing import Any

import msgspec

from dist_jobs.spec import json_schema
from dist_jobs.spec.train import TrainConfig
from dist_jobs.spec.validate import description


def _fields(node: dict[str, Any], defs: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Every field of the schema by its dotted path (a list's item section as `path[]`)."""
    found: dict[str, dict[str, Any]] = {}
    for key, prop in node["properties"].items():
        found[path + key] = prop
        for ref in _refs(prop):
            found.update(_fields(defs[ref], defs, f"{path}{key}{'[]' if prop.get('type') == 'array' else ''}."))
    return found


def _refs(prop: dict[str, Any]) -> list[str]:
    nodes = [prop, prop.get("items", {}), *prop.get("anyOf", [])]
    return [n["$ref"].rsplit("/", 1)[-1] for n in nodes if isinstance(n.get("$ref"), str)]


def test_every_field_of_the_spec_has_a_description() -> None:
    schema = json_schema()
    fields = _fields(schema, schema["$defs"])
    assert len(fields) > 120  # the walk reaches every section, tolerations' items included
    assert "k8s.tolerations[].tolerationSeconds" in fields
    missing = sorted(path for path, prop in fields.items() if not prop.get("description", "").strip())
    assert missing == []


def test_the_trainer_flags_carry_the_field_descriptions_as_help() -> None:
    # `python -m dist_jobs.train --help` reads the same text (TrainConfig.from_argv), optional
    # fields included: their description sits outside the `| None`.
    for field in msgspec.structs.fields(TrainConfig):
        assert description(field.type), field.name
