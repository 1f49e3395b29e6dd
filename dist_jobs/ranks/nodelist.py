"""Expand SLURM hostlist expressions (`n[1-3,5]`, `gpu[001-128]`, `rack[1-2]-node[01-04]`).

Same results as `scontrol show hostnames`, without needing SLURM's client on the machine
that renders or the process that resolves its rank. Runnable on its own, because the sbatch
template calls it before any Python environment of the job is known to be importable fast:

    python -m dist_jobs.ranks.nodelist [--head|--count] NODELIST

Only the stdlib and dist_jobs.errors are imported: this runs once per job step.
"""

from __future__ import annotations

import itertools
import sys
from typing import TextIO

from dist_jobs.errors import UsageError

# SLURM refuses one bracket range wider than 64K hosts (hostlist.c MAX_RANGE); the total cap
# keeps a typo like `n[1-9][1-99999]` from eating memory.
MAX_RANGE = 64 * 1024
MAX_HOSTS = 1 << 20

# hostlist_create() splits on these outside brackets; empty items are skipped.
_SEPARATORS = ", \t\n"

_HINT = "write hosts like n1,n2 or n[1-3,5] or gpu[001-128] or rack[1-2]-node[01-04]"


def expand(nodelist: str) -> list[str]:
    """Every host of `nodelist`, in scontrol's order (first bracket varies slowest)."""
    hosts: list[str] = []
    for item in _split_items(nodelist):
        hosts.extend(_expand_item(item, nodelist))
        if len(hosts) > MAX_HOSTS:
            raise UsageError(
                f"nodelist {_short(nodelist)} expands to more than {MAX_HOSTS} hosts",
                hint="check the ranges for a typo",
            )
    if not hosts:
        raise UsageError(f"nodelist {nodelist!r} names no host", hint=_HINT)
    return hosts


def head(nodelist: str) -> str:
    """The first host: by SLURM convention the node running task 0 of the step."""
    return expand(nodelist)[0]


def _split_items(nodelist: str) -> list[str]:
    """Split on separators that are not inside brackets; check bracket nesting on the way."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in nodelist:
        if char == "[":
            if depth:
                raise UsageError(f"nested '[' in nodelist {_short(nodelist)}", hint=_HINT)
            depth = 1
        elif char == "]":
            if not depth:
                raise UsageError(f"']' without '[' in nodelist {_short(nodelist)}", hint=_HINT)
            depth = 0
        if char in _SEPARATORS and not depth:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise UsageError(f"'[' without ']' in nodelist {_short(nodelist)}", hint=_HINT)
    items.append("".join(current))
    return [item for item in items if item]


def _expand_item(item: str, nodelist: str) -> list[str]:
    """One host expression: literal text and bracket groups, expanded as a cartesian product."""
    parts: list[list[str]] = []
    rest = item
    while "[" in rest:
        before, _, after = rest.partition("[")
        inside, _, rest = after.partition("]")
        if before:
            parts.append([before])
        parts.append(_expand_ranges(inside, nodelist))
    if rest:
        parts.append([rest])
    count = 1
    for choices in parts:
        count *= len(choices)
    if count > MAX_HOSTS:
        raise UsageError(
            f"nodelist item {_short(item)} expands to {count} hosts (limit {MAX_HOSTS})",
            hint="check the ranges for a typo",
        )
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_ranges(inside: str, nodelist: str) -> list[str]:
    """`1-3,5` -> 1 2 3 5; the width of each range's lower bound sets its zero padding."""
    if not inside:
        raise UsageError(f"empty brackets '[]' in nodelist {_short(nodelist)}", hint=_HINT)
    values: list[str] = []
    for piece in inside.split(","):
        low_text, dash, high_text = piece.partition("-")
        if not _is_digits(low_text) or (dash and not _is_digits(high_text)):
            raise UsageError(
                f"bad range {piece!r} in nodelist {_short(nodelist)}: expected a number or two numbers joined by '-'",
                hint=_HINT,
            )
        low = int(low_text)
        high = int(high_text) if dash else low
        if high < low:
            raise UsageError(
                f"range {piece!r} in nodelist {_short(nodelist)} runs backwards",
                hint=f"write it low to high: [{high_text}-{low_text}]",
            )
        if high - low + 1 > MAX_RANGE:
            raise UsageError(
                f"range {piece!r} in nodelist {_short(nodelist)} has {high - low + 1} hosts "
                f"(SLURM's limit is {MAX_RANGE})",
                hint="check the range for a typo",
            )
        width = len(low_text)
        values.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return values


def _is_digits(text: str) -> bool:
    # str.isdigit() accepts superscripts and other scripts' digits; SLURM takes ASCII only.
    return bool(text) and text.isascii() and text.isdigit()


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


_USAGE = "usage: python -m dist_jobs.ranks.nodelist [--head|--count] NODELIST"


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of `python -m dist_jobs.ranks.nodelist`: one host per line, or the first, or a count."""
    args = list(sys.argv[1:] if argv is None else argv)
    stream = sys.stdout if out is None else out
    mode = "all"
    if args and args[0] in ("--head", "--count"):
        mode = args.pop(0)[2:]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        sys.stderr.write(_USAGE + "\n")
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    try:
        hosts = expand(args[0])
    except UsageError as error:
        sys.stderr.write(f"error: {error}\n")
        return error.exit_code
    if mode == "head":
        stream.write(hosts[0] + "\n")
    elif mode == "count":
        stream.write(f"{len(hosts)}\n")
    else:
        stream.write("".join(host + "\n" for host in hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
