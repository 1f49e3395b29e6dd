"""The one result type of rank resolution, the shape of a rank source, and env parsing.

Stdlib only: the runtime resolves its rank before it imports torch, so that a bad launch
fails in milliseconds with a message instead of hanging in rendezvous.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import ClassVar

from dist_jobs.errors import RankError

Environ = Mapping[str, str]

DEBUG_HINT = "run `dist-jobs env` in the same launch to see what every process resolved"


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, whichever launcher started it."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def env_vars(self) -> dict[str, str]:
        """torch's env:// variables (and torchrun's names for the node rank) for this process."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def export(self, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
        """Set the env:// variables in `environ` (default os.environ); returns what was set."""
        target: MutableMapping[str, str] = os.environ if environ is None else environ
        values = self.env_vars()
        target.update(values)
        return values


class RankSource:
    """One launcher's view of the environment, in the style of Lightning's ClusterEnvironment.

    `required` names what `resolve` cannot do without; `"A|B"` means either. `variables`
    says which variable each RankInfo field comes from, so messages can name it.
    """

    name: ClassVar[str] = ""
    required: ClassVar[tuple[str, ...]] = ()
    variables: ClassVar[Mapping[str, str]] = {}
    launch_hint: ClassVar[str] = ""

    def detect(self, environ: Environ) -> bool:
        raise NotImplementedError

    def resolve(self, environ: Environ) -> RankInfo:
        raise NotImplementedError

    def missing(self, environ: Environ) -> list[str]:
        """Required variables that are absent or empty (alternatives joined by '|')."""
        return [spec for spec in self.required if not any(environ.get(name, "").strip() for name in spec.split("|"))]

    def require(self, environ: Environ) -> None:
        """Raise one RankError naming every missing required variable."""
        missing = self.missing(environ)
        if missing:
            raise RankError(
                f"{self.name}: {list_missing(missing)} in this process's environment",
                hint=self.launch_hint or DEBUG_HINT,
            )

    def describe(self, field: str) -> str:
        """The variable(s) a RankInfo field came from, for messages: 'SLURM_PROCID'."""
        return self.variables.get(field, field)


def list_missing(specs: list[str]) -> str:
    """'A|B', 'C' -> 'A (or B) and C are not set'."""
    names = []
    for spec in specs:
        main, *alternatives = spec.split("|")
        names.append(f"{main} (or {', '.join(alternatives)})" if alternatives else main)
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{joined} {'is' if len(names) == 1 else 'are'} not set"


def first(environ: Environ, *names: str) -> str | None:
    """The first of `names` that is set to a non-empty value, or None."""
    for name in names:
        if environ.get(name, "").strip():
            return name
    return None


def parse_int(name: str, value: str, *, minimum: int = 0, maximum: int | None = None, hint: str | None = None) -> int:
    """int(value), or a RankError naming the variable, its bad value and the valid range."""
    text = value.strip()
    try:
        number = int(text, 10)
    except ValueError:
        number = None
    bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise RankError(
            f"{name}={value!r} is not a whole number {bounds}",
            hint=hint or f"unset {name} or fix how it is exported; {DEBUG_HINT}",
        )
    return number


def env_int(
    environ: Environ,
    *names: str,
    minimum: int = 0,
    maximum: int | None = None,
    default: int | None = None,
    hint: str | None = None,
) -> int:
    """Parse the first set variable of `names`; `default` if none is set, else a RankError."""
    name = first(environ, *names)
    if name is None:
        if default is not None:
            return default
        raise RankError(
            f"{' or '.join(names)} is not set in this process's environment",
            hint=hint or DEBUG_HINT,
        )
    return parse_int(name, environ[name], minimum=minimum, maximum=maximum, hint=hint)


def master_port(environ: Environ, *names: str, default: int | None = None, hint: str | None = None) -> int:
    """MASTER_PORT-like variable parsed as a TCP port."""
    return env_int(environ, *names, minimum=1, maximum=65535, default=default, hint=hint)
