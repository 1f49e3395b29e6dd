"""The CLI's ArgumentParser: a flag's value is kept even when it is `--`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any


class Parser(argparse.ArgumentParser):
    # each verb's own parser (dist-jobs VERB ...), by name, as build() adds them: its usage is
    # what an error of that verb shows
    verbs: dict[str, argparse.ArgumentParser]

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # main() has cut argv at its first bare `--` (the job's command) before parsing, so a `--`
        # that reaches a flag here is its value (`--workdir=--`). argparse before 3.13 drops it and
        # hands the flag [] (3.13 keeps it): no public hook sees the value before that, so this
        # override goes once 3.12 is no longer promised.
        if sys.version_info < (3, 13) and action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:
    """The parser's subcommand actions: the verbs of `dist-jobs`, the actions of `config`. Their
    `choices` are the subcommands' parsers by name, their `dest` the attribute naming the one given."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action
