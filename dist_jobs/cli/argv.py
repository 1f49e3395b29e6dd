"""The CLI's ArgumentParser: quick to build, and a flag's value is kept even when it is `--`."""

from __future__ import annotations

import argparse
import os
import sys

TYPE_CHECKING = False  # typing: the query verbs' start-up does without it
if TYPE_CHECKING:
    from typing import Any


class Parser(argparse.ArgumentParser):
    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every add_argument (to check the metavar), and one asks
        # shutil (a 2 ms import) for the terminal's width: os answers the same question.
        return self.formatter_class(prog=self.prog, width=_columns())  # type: ignore[call-arg]

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # main() has cut argv at its first bare `--` (the job's command) before parsing, so a `--`
        # that reaches a flag here is its value (`--workdir=--`), which argparse would drop.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def _columns() -> int:
    """shutil.get_terminal_size's answer: $COLUMNS, else the terminal's width, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80
