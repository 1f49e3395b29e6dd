"""Typed validation with every problem reported at once, on msgspec.

msgspec validates fast and imports in about 10 ms (pydantic took about 100 ms with the spec's
models built, half of `dist-jobs render`'s start-up), but it stops at the first error. So a
valid input is converted in one call, and only an invalid one is walked field by field, key by
key and item by item, so that each problem is reported with its own path, given value and fix.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

from dist_jobs.errors import MISSING, Problem, SpecError

T = TypeVar("T")

# Python's `$` also matches before a final newline ("64G\n" would pass `^[0-9]+G$`); this is
# end-of-text in Python and in JSON Schema's ECMA regexes alike.
END = r"(?![\s\S])"

_PATTERNS: dict[str, tuple[str, str]] = {}


def checked(pattern: str, message: str, hint: str) -> msgspec.Meta:
    """A string pattern whose failure reads as `message` with `hint`, not as the raw regex."""
    _PATTERNS[repr(pattern)] = (message, hint)  # msgspec's message shows the pattern's repr
    return msgspec.Meta(pattern=pattern)


# Free text: anything but NUL, which no argv or environment value can carry, and bytes that are
# not UTF-8 (a raw byte on the command line), which no YAML manifest can carry.
Text = Annotated[
    str,
    checked(
        r"^[^\x00\ud800-\udfff]*" + END,
        "contains a NUL character or bytes that are not UTF-8, which no shell or YAML value can carry",
        "remove the NUL character; give the text as UTF-8",
    ),
]


def convert(cls: type[T], raw: Any, source: str) -> T:
    """`raw` (YAML-loaded data or flag strings) as a `cls`, or one SpecError with every problem."""
    try:
        return msgspec.convert(raw, cls, strict=False)
    except msgspec.ValidationError as first:
        problems = check(raw, cls, ())
        if not problems:  # a rule the walk does not see: report msgspec's own path and message
            problems = [_from_message(str(first), (), raw, cls)]
        raise SpecError(problems, source) from None


def check(value: Any, tp: Any, path: tuple[Any, ...]) -> list[Problem]:
    """Every problem of `value` as a `tp`, each at its own path."""
    base = plain_type(tp)
    origin = get_origin(base)
    if isinstance(base, type) and issubclass(base, msgspec.Struct) and isinstance(value, dict):
        return _check_struct(value, base, path)
    if origin is dict and isinstance(value, dict):
        key_type, value_type = get_args(base)
        problems: list[Problem] = []
        for key, item in value.items():
            problems += check(key, key_type, (*path, key, "[key]"))
            problems += check(item, value_type, (*path, key))
        return problems
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        item_type = get_args(base)[0]
        return [p for i, item in enumerate(value) for p in check(item, item_type, (*path, i))]
    try:
        msgspec.convert(value, tp, strict=False)
    except msgspec.ValidationError as exc:
        return [_from_message(str(exc), path, value, tp)]
    return []


def _check_struct(value: dict[Any, Any], cls: type[msgspec.Struct], path: tuple[Any, ...]) -> list[Problem]:
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    problems: list[Problem] = []
    for key, item in value.items():
        if key in fields:
            problems += check(item, fields[key].type, (*path, key))
            continue
        found = suggest(cls, str(key))
        hint = f"did you mean `{found}`?" if found else f"known keys here: {', '.join(sorted(fields))}"
        problems.append(Problem(field_path((*path, key)), MISSING, "unknown key", hint))
    for name, f in fields.items():
        if f.required and name not in value:
            problems.append(Problem(field_path((*path, name)), MISSING, "is required", "add this key"))
    return problems


def suggest(cls: type[msgspec.Struct], key: str) -> str | None:
    """What an unknown `key` of `cls` likely meant, as a path below `cls`: the same key in one of
    its sections (`epochs` -> `train.epochs`), else a close name here, else one in a section."""
    import difflib  # an unknown key's alone: a valid spec's render does without it (bench_render)

    fields = [f.encode_name for f in msgspec.structs.fields(cls)]
    below = [f"{name}.{sub}" for name, section in _sections(cls) for sub in section]
    exact = [path for path in below if path.rsplit(".", 1)[1] == key]
    if exact:
        return exact[0]
    close = difflib.get_close_matches(key, fields, n=1)
    if close:
        return close[0]
    leaves = {path.rsplit(".", 1)[1]: path for path in below}
    nearby = difflib.get_close_matches(key, list(leaves), n=1)
    return leaves[nearby[0]] if nearby else None


def _sections(cls: type[msgspec.Struct]) -> list[tuple[str, list[str]]]:
    """`cls`'s fields that are structs of their own (train, slurm, ...), each with its keys."""
    out = []
    for f in msgspec.structs.fields(cls):
        tp = plain_type(f.type)
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            out.append((f.encode_name, [g.encode_name for g in msgspec.structs.fields(tp)]))
    return out


def unknown_path(cls: type[msgspec.Struct], dotted: str) -> tuple[str, str | None, list[str]] | None:
    """Where the dotted path (an override, `--set train.lr=...`) leaves `cls`'s fields: the
    unknown part (`train.epoch`), what it likely meant in full (`train.epochs`) and the keys known
    there; None when every part is a field (below a mapping or list, any key is)."""
    parts = dotted.split(".")
    node = cls
    for i, part in enumerate(parts):
        fields = {f.encode_name: f for f in msgspec.structs.fields(node)}
        if part not in fields:
            found = suggest(node, part)
            full = ".".join([*parts[:i], found]) if found else None
            return ".".join(parts[: i + 1]), full, sorted(fields)
        tp = plain_type(fields[part].type)
        if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
            return None
        node = tp
    return None


def field_path(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        if part == "[key]":
            out += " (the key)"
        else:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


_TYPES = {
    "int": ("must be a whole number", "give a whole number"),
    "float": ("must be a number", "give a number, e.g. 0.1"),
    "bool": ("must be true or false", "use true or false"),
    "str": ("must be text", "quote it in YAML, e.g. '90'"),
    "array": ("must be a list", "give a YAML list"),
    "object": ("must be a mapping", "give a YAML mapping"),
}
# Patterns as text, compiled (and cached by `re`) on the first error: a valid spec never needs them.
_EXPECTED = r"Expected `(\w+)(?: \| null)?`, got `\w+`"
_EXPECTED_ANY = r"Expected `([\w |]+?)(?: \| null)?`, got `\w+`"
_BOUND = r"Expected `(?:int|float)(?: \| null)?` (>=|<=|>|<) (\S+)"
_PATTERN = r"(?s)Expected `str(?: \| null)?` matching regex (.*)"
_BOUND_TEXT = {
    ">=": ("is below the minimum {}", "raise it to at least {}"),
    "<=": ("is above the maximum {}", "lower it to at most {}"),
    ">": ("must be greater than {}", "give a value above {}"),
    "<": ("must be less than {}", "give a value below {}"),
}


def _from_message(text: str, path: tuple[Any, ...], value: Any, tp: Any) -> Problem:
    message, _, where = text.partition(" - at `")
    sub = where.removeprefix("key` in `").rstrip("`").removeprefix("$")
    where_path = ((field_path(path) if path else "") + sub).lstrip(".") or "(top level)"
    given = MISSING if message.startswith("Object missing") else _at(value, sub)
    if m := re.fullmatch(_EXPECTED, message):
        return Problem(where_path, given, *_TYPES.get(m.group(1), (message, "")))
    if m := re.fullmatch(_EXPECTED_ANY, message):  # a union (time: minutes or text)
        known = [_TYPES[t] for t in m.group(1).split(" | ") if t in _TYPES]
        if known:
            what = " or ".join(w.removeprefix("must be ") for w, _ in known)
            return Problem(where_path, given, f"must be {what}", "; ".join(fix for _, fix in known))
    if m := re.fullmatch(_BOUND, message):
        what, fix = _BOUND_TEXT[m.group(1)]
        bound = m.group(2).removesuffix(".0")
        return Problem(where_path, given, what.format(bound), fix.format(bound))
    if m := re.fullmatch(_PATTERN, message):
        what, fix = _PATTERNS.get(m.group(1), (f"does not match {m.group(1)}", "follow the pattern shown"))
        return Problem(where_path, given, what, fix)
    if message.startswith("Invalid enum value"):
        return Problem(where_path, given, f"must be {_one_of(_literal_values(tp))}", "use one of the listed values")
    return Problem(where_path, given, message, "")


def _at(value: Any, sub: str) -> Any:
    """The part of `value` at msgspec's sub-path `.key[0]...`; MISSING where it cannot be followed."""
    for key, index in re.findall(r"\.(\w+)|\[(\d+)\]", sub):
        try:
            value = value[int(index)] if index else value[key]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return MISSING if "[...]" in sub else value


def _one_of(choices: list[Any]) -> str:
    quoted = [repr(c) for c in choices] or ["one of the listed values"]
    return " or ".join(filter(None, [", ".join(quoted[:-1]), quoted[-1]]))


def plain_type(tp: Any) -> Any:
    """`tp` without its `Annotated[...]` layers."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _literal_values(tp: Any) -> list[Any]:
    tp = plain_type(tp)
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    if get_origin(tp) is Union or isinstance(tp, types.UnionType):
        return [v for arg in get_args(tp) for v in _literal_values(arg)]
    return []


def description(tp: Any) -> str | None:
    """The outermost `Meta(description=...)` of a field's type, for help texts."""
    while get_origin(tp) is Annotated:
        for meta in get_args(tp)[1:]:
            if isinstance(meta, msgspec.Meta) and meta.description:
                return meta.description
        tp = get_args(tp)[0]
    return None
