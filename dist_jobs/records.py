"""`Record`: frozen value objects for the CLI's query path, without `dataclasses`.

`import dataclasses` pulls in inspect, ast, dis and tokenize: about 10 ms that
`dist-jobs list/status/cancel/logs` paid on every call, against a goal of 1.2x
`python -c "import yaml"` plus the scheduler command. A Record is declared like a frozen
dataclass (annotated fields, defaults as class values) and mypy checks it as one (PEP 681);
`__init__`, equality, hashing, repr, `replace()` and `as_dict()` come from here. A dict, list
or set default is copied for each instance, as `field(default_factory=...)` would.
"""

from __future__ import annotations

# typing costs the query verbs about 3 ms of start-up; mypy honours a local TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    R = TypeVar("R", bound="Record")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls


_MUTABLE = (dict, list, set)


@dataclass_transform(frozen_default=True)
class Record:
    _fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls) -> None:
        own = tuple(name for name, kind in cls.__dict__.get("__annotations__", {}).items() if "ClassVar" not in kind)
        cls._fields = cls._fields + tuple(name for name in own if name not in cls._fields)

    def __init__(self, *args: object, **kwargs: object) -> None:
        kind = type(self)
        if len(args) > len(self._fields):
            raise TypeError(f"{kind.__name__}() takes {len(self._fields)} arguments, {len(args)} given")
        values = dict(zip(self._fields, args))
        for name, value in kwargs.items():
            if name not in self._fields or name in values:
                raise TypeError(f"{kind.__name__}() got an unexpected or repeated argument {name!r}")
            values[name] = value
        for name in self._fields:
            if name not in values:
                if not hasattr(kind, name):
                    raise TypeError(f"{kind.__name__}() missing argument {name!r}")
                default = getattr(kind, name)
                values[name] = type(default)(default) if isinstance(default, _MUTABLE) else default
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: make a new one with .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def replace(self: R, **changes: object) -> R:
        return type(self)(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, object]:
        """The fields by name, in declaration order (values as they are: no deep copy)."""
        return {name: getattr(self, name) for name in self._fields}

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"
