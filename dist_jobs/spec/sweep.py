"""A sweep's trials: `--grid KEY=V1,V2,...` (cartesian product) or `--random N` samples.

Values of a grid are a comma list (`train.lr=0.1,0.03`), each read as YAML reads a scalar, as
`--set` does. With `--random N --seed S` a key may instead name a range: `uniform:LO:HI`,
`loguniform:LO:HI` (both floats, 6 significant digits) or `int:LO:HI` (both ends included);
a list is then sampled uniformly. Every trial is a full spec: `sweep_specs` loads each one
through `load_spec`, so an unknown key gets its did-you-mean and a bad value its field, value
and fix, all trials' problems collected, deduplicated and raised once.

Trial i of sweep NAME is the run `NAME-t<i>` (i zero-padded to the width of the trial count)
under the checkpoint root `<checkpoint_dir>/NAME/`, which also holds the sweep's manifest.
"""

from __future__ import annotations

import itertools
import math
import posixpath
import random as random_module
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dist_jobs.errors import MISSING, Problem, SpecError

RANGES = ("uniform", "loguniform", "int")
# The sweep sets these per trial: sweeping them would put trials in one run directory.
OWNED = ("name", "checkpoint_dir", "train.run_name", "train.checkpoint_dir", "slurm.array")
NAME_MAX = 100  # + "-t<i>" stays within the run-name limit (128) and readable
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_TRIALS = 10_000


@dataclass(frozen=True)
class Range:
    kind: str  # uniform | loguniform | int
    low: float
    high: float

    def sample(self, rng: random_module.Random) -> float | int:
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "loguniform":
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return float(f"{value:.6g}")

    def __repr__(self) -> str:
        return f"{self.kind}:{self.low:g}:{self.high:g}"


Axis = list[Any] | Range


def parse_grid(items: Sequence[str], scalar: Any) -> dict[str, Axis]:
    """`KEY=V1,V2` items as {key: values or Range}; `scalar` reads one value (YAML, as --set)."""
    grid: dict[str, Axis] = {}
    problems: list[Problem] = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key or not text:
            problems.append(Problem("--grid", item, "must look like KEY=V1,V2,...", "e.g. --grid train.lr=0.1,0.01"))
        elif key in grid:
            problems.append(Problem(f"--grid {key}", item, "is given twice", "give each key once, all its values"))
        else:
            kind, _, rest = text.partition(":")
            axis = _range(key, kind, rest, problems) if kind in RANGES and rest else None
            read = (lambda v, _: v) if key.startswith("env.") else scalar  # env values are text, as --env's
            grid[key] = axis if axis is not None else [read(v, f"--grid {key}") for v in text.split(",")]
    if problems:
        raise SpecError(problems, "sweep grid")
    return grid


def _range(key: str, kind: str, rest: str, problems: list[Problem]) -> Range | None:
    low_text, _, high_text = rest.partition(":")
    fix = f"write it like {kind}:1e-4:1e-1 (low < high{', both > 0' if kind == 'loguniform' else ''})"
    try:
        low, high = (int(low_text), int(high_text)) if kind == "int" else (float(low_text), float(high_text))
    except ValueError:
        problems.append(Problem(f"--grid {key}", f"{kind}:{rest}", "is not a range LOW:HIGH", fix))
        return Range(kind, 0, 0)
    if not low < high or (kind == "loguniform" and low <= 0) or not all(map(math.isfinite, (low, high))):
        problems.append(Problem(f"--grid {key}", f"{kind}:{rest}", "is not a valid range", fix))
    return Range(kind, low, high)


def trials(grid: Mapping[str, Axis], random: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """The trials' parameters: the cartesian product of the lists, or `random` samples."""
    problems: list[Problem] = []
    if not grid:
        problems.append(Problem("--grid", MISSING, "no parameters to sweep", "add --grid KEY=V1,V2 (repeatable)"))
    ranged = [k for k, v in grid.items() if isinstance(v, Range)]
    if random is None and ranged:
        for key in ranged:
            problems.append(
                Problem(f"--grid {key}", grid[key], "a range has no grid points", "sample it: add --random N --seed S")
            )
    if random is not None and random < 1:
        problems.append(Problem("--random", random, "must be at least 1", "give the number of trials, e.g. 8"))
    if problems:
        raise SpecError(problems, "sweep grid")
    if random is not None:
        rng = random_module.Random(seed)
        return [{k: _draw(v, rng) for k, v in grid.items()} for _ in range(random)]
    lists = [v for v in grid.values() if isinstance(v, list)]
    count = math.prod(len(v) for v in lists)
    if count > MAX_TRIALS:
        raise SpecError([Problem("--grid", count, f"is more than {MAX_TRIALS} trials", "sample it: --random N")])
    return [dict(zip(grid, values)) for values in itertools.product(*lists)]


def _draw(axis: Axis, rng: random_module.Random) -> Any:
    return axis.sample(rng) if isinstance(axis, Range) else rng.choice(axis)


def trial_name(name: str, index: int, count: int) -> str:
    return f"{name}-t{index:0{len(str(count - 1))}d}"


def sweep_root(checkpoint_dir: str, name: str) -> str:
    """The sweep's folder under the spec's checkpoint root: the trials' root and the manifest's home."""
    return posixpath.join(checkpoint_dir, name)


def name_problems(name: str, params: Sequence[Mapping[str, Any]]) -> list[Problem]:
    problems = []
    if len(name) > NAME_MAX or not _NAME.fullmatch(name):
        problems.append(
            Problem(
                "name",
                name,
                f"is not a sweep name: [A-Za-z0-9._-], at most {NAME_MAX} characters, starting with a letter or digit",
                "give --name like lr-sweep",
            )
        )
    owned = sorted({k for p in params for k in p if k in OWNED})
    problems += [
        Problem(f"--grid {k}", MISSING, "is set by the sweep for each trial", "sweep another key") for k in owned
    ]
    return problems


def base_problems(first: Any, backend: str) -> list[Problem]:
    """What the base spec may not set in a sweep: one run folder for all, or its own array."""
    problems = [
        Problem(
            f"train.{key}",
            getattr(first.train, key),
            "would put every trial in one run directory",
            "leave it out: trial i runs as NAME-t<i> under <checkpoint_dir>/NAME",
        )
        for key in ("run_name", "checkpoint_dir")
        if getattr(first.train, key)
    ]
    if backend == "slurm" and first.slurm.array:
        fix = "leave it out; --max-parallel K sets how many run at once (%K)"
        problems.append(Problem("slurm.array", first.slurm.array, "a sweep on SLURM is its own job array", fix))
    return problems


def command_problems(params: Sequence[Mapping[str, Any]]) -> list[Problem]:
    """With its own command (after `--`) a job ignores train.*: sweeping it would run one job N times."""
    keys = sorted({k for p in params for k in p if k.startswith("train.")})
    return [
        Problem(
            f"--grid {k}",
            MISSING,
            "has no effect: the job runs its own command (after `--`), not the built-in trainer",
            "sweep env.KEY values and read them in your script, or sweep without a command",
        )
        for k in keys
    ]


def overrides_for(name: str, root: str, index: int, count: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """The dotted overrides that make the base spec trial `index`."""
    return {**params, "name": trial_name(name, index, count), "checkpoint_dir": root}


def dedupe(problems: Sequence[Problem]) -> list[Problem]:
    seen: dict[tuple[str, str, str], Problem] = {}
    for p in problems:
        seen.setdefault((p.field, repr(p.value), p.message), p)
    return list(seen.values())
