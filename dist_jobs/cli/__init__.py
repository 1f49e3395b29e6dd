"""`dist-jobs`: the only module that prints and exits.

Every typed error becomes its message and hint on stderr with its exit code (2 for bad input);
only a bug shows a traceback. The query verbs (list, status, cancel, logs) import only what they
use: no spec flags or renderer (see cli.parser).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from dist_jobs.cli.argv import Parser, subcommands
from dist_jobs.cli.commands import COMMANDS
from dist_jobs.cli.parser import build as _parser
from dist_jobs.errors import DistJobsError


def main(argv: Sequence[str] | None = None) -> int:
    own, command = split_command(list(sys.argv[1:] if argv is None else argv))
    if own[:1] == ["sweep"] and own[1:2] in (["status"], ["cancel"]):  # `sweep SPEC` takes a positional
        from dist_jobs.cli.sweep import cmd_sweep_sub  # a sweep's modules are for `sweep` alone (test_imports)

        return _guarded(f"sweep {own[1]}", lambda: cmd_sweep_sub(own[1], own[2:]))
    parser = _parser(next((a for a in own if not a.startswith("-")), None))
    args, unknown = parser.parse_known_args(own)
    if unknown:
        return _unknown_options(parser, args, own, unknown)
    if command is not None and args.verb not in ("render", "submit", "run", "sweep"):
        print(
            f"dist-jobs {args.verb}: a command after `--` only goes with render, submit, run or sweep", file=sys.stderr
        )
        return 2
    if args.verb == "completion":  # it reads the whole parser (cli.parser)
        # its verb's alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
        from dist_jobs.cli.completion import script

        sys.stdout.write(script(_parser(), args.shell))
        return 0
    return _guarded(args.verb, lambda: COMMANDS[args.verb](args, command))


def _unknown_options(parser: Parser, args: argparse.Namespace, own: list[str], unknown: list[str]) -> int:
    """Options the verb does not take: its own usage (not the top level's), and for a training
    flag (`--shm-allreduce`, `--model gpt`, as the trainer takes them) its `--set train.X=...`."""
    from dist_jobs.cli.flags import trainer_flag_fixes  # this error's alone

    verb = args.verb
    shown = parser.verbs.get(verb, parser)
    for action in subcommands(shown):  # `config show`: the action's own usage
        if getattr(args, action.dest, None) in action.choices:
            shown = action.choices[getattr(args, action.dest)]
    shown.print_usage(sys.stderr)
    print(f"dist-jobs {verb}: unrecognized arguments: {' '.join(unknown)}", file=sys.stderr)
    fixes = trainer_flag_fixes(own) if verb in ("render", "submit", "run", "sweep", "config") else []
    if fixes:
        print(f"  hint: training flags are spec fields: {' '.join(fixes)}", file=sys.stderr)
    return 2


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Everything after the first `--` is the job's command, verbatim."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, None


def _guarded(verb: str, run: Callable[[], int]) -> int:
    """Run a verb: a typed error becomes its message and exit code, Ctrl-C 130; no traceback."""
    try:
        return run()
    except DistJobsError as exc:
        print(f"dist-jobs {verb}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dist-jobs {verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
