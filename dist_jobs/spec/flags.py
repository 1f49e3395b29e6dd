"""A command-line flag that sets one spec field: the CLI declares the job's own, each backend
those of its spec section (Backend.spec_flags), and the CLI adds them all to its parser.

Plain data, no argparse: a backend declares its flags without importing the CLI.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

# value: `--flag VALUE`; true: `--flag` alone sets true; append: repeatable, a list;
# env: repeatable KEY=VALUE into env.KEY; set: repeatable PATH=VALUE into any field
Kind = Literal["value", "true", "append", "env", "set"]


# A NamedTuple, not a dataclass: every backend class declares some, so each verb that reads the
# registry (status included) builds them at start-up, where a dataclass costs a millisecond.
class SpecFlag(NamedTuple):
    flag: str  # --partition
    path: str  # the dotted spec path it sets: slurm.partition ("" for --set, which names its own)
    help: str  # plain text: the CLI escapes what argparse would read as a format
    kind: Kind = "value"
