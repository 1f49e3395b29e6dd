"""The argument parser of `dist-jobs`: only the verb being run is built, with its arguments (all of
them for `--help` and completion).

Building one verb's parser keeps argparse's per-argument work for the other verbs' flags out of
every call (start-up budgets: BENCHMARKS.md, checked by bench/bench_cli_verbs.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dist_jobs import api
from dist_jobs.cli.argv import Parser
from dist_jobs.constants import VERSION

OUTPUT = ("table", "json", "yaml")
HELP = {  # each verb's line in `dist-jobs --help`, in this order
    "render": "print the job's script or manifest, to submit by hand",
    "submit": "submit the job (--dry-run prints what would be submitted)",
    "run": "run the job here, in the foreground (gloo on CPU without GPUs)",
    "status": "show a job's state (normalised and the scheduler's word), which rank failed, and its progress",
    "cancel": "cancel a job",
    "logs": "print a job's logs",
    "plot": "draw a run's loss, throughput and accuracy per step, every attempt and fault: -o run.png",
    "wait": "wait for a job to end; exit 0 if it succeeded, 1 failed, 3 cancelled, 4 timeout",
    "list": "list dist-jobs jobs",
    "env": "print the ranks this process resolves (run it under srun/torchrun)",
    "schema": "print the job spec's JSON Schema (for editor completion of job.yaml)",
    "completion": 'print a shell completion script: eval "$(dist-jobs completion bash)"',
    "export": "write a run's checkpoint (sharded or not) as one model state dict for inference: -o model.pt",
    "sweep": "submit a grid or random search of one spec: one trial per set of values (then: sweep status NAME)",
    "config": "config show: the merged spec (config file < profile < job.yaml < flags), each value's source",
}


def build(verb: str | None = None) -> Parser:
    """Every verb, with the arguments of `verb` only (of all, when None)."""
    parser = Parser(
        prog="dist-jobs",
        # read from the registry only where every verb is built (help, completion, an unknown
        # verb), which reads it anyway: one verb's parser shows no description
        description=_description() if verb not in HELP else None,
        epilog="A command after `--` replaces the default training entrypoint.",
    )
    parser.add_argument("--version", action="version", version=f"dist-jobs {VERSION}")
    parser.verbs = {}
    # prog given: argparse would otherwise format a usage line to make it
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND", prog="dist-jobs")
    # A known verb gets its own parser alone (each costs argparse ~0.2 ms); help and completion,
    # and the error for an unknown verb, list them all.
    for name, text in HELP.items() if verb not in HELP else [(verb, HELP[verb])]:
        if name == "sweep" and verb in (None, "sweep"):
            from dist_jobs.cli.sweep import add_sweep_parser  # a sweep's modules are for `sweep` alone

            add_sweep_parser(sub, text, backend_options, output_option)
            continue
        p = sub.add_parser(name, help=text)
        parser.verbs[name] = p
        if verb in (None, name) and name in ARGUMENTS:
            ARGUMENTS[name](p)
    return parser


def _description() -> str:
    """What one job spec becomes on each backend: `dist-jobs --help`'s first line."""
    kinds = "; ".join(f"{cls.name}: {cls.summary}" for cls in api.backend_classes())
    return f"One job spec, for every backend ({kinds})."


def backend_choice(p: argparse.ArgumentParser, help: str, which: Callable[[Any], bool] = bool, **kwargs: Any) -> None:
    """--backend, its choices the registry's backends (`which` of their classes); `{summaries}` in
    `help` is each one's name and summary, as `NAME: SUMMARY; NAME: SUMMARY`."""
    chosen = [cls for cls in api.backend_classes() if which(cls)]
    summaries = "; ".join(f"{cls.name}: {cls.summary}" for cls in chosen)
    choices = api.Names([cls.name for cls in chosen])  # another package's backend, by its name too
    p.add_argument("--backend", choices=choices, help=help.format(summaries=summaries), **kwargs)


def _render(p: argparse.ArgumentParser) -> None:
    backend_choice(p, "{summaries} (or the profile's)", lambda cls: cls.renders)
    p.add_argument("-o", "--output", help="write to FILE instead of stdout")
    _spec_flags(p)


def _submit(p: argparse.ArgumentParser) -> None:
    backend_choice(p, "the scheduler ({summaries}; or the profile's)")
    p.add_argument("--dry-run", action="store_true", help="print the exact payload; submit nothing")
    p.add_argument(
        "--wait", action="store_true", help="wait for the job to end; exit 0 if it succeeded, 1 if it failed"
    )
    p.add_argument(
        "--follow", "-f", action="store_true", help="print every rank's log as it is written (implies --wait)"
    )
    p.add_argument("--timeout", type=float, help="with --wait: give up after SECONDS (exit 4)")
    output_option(p)
    backend_options(p, lookup=False)
    _spec_flags(p)


def _run(p: argparse.ArgumentParser) -> None:
    here = [cls.name for cls in api.backend_classes() if cls.runs_here]
    backend_choice(p, "where the job runs in the foreground ({summaries})", lambda cls: cls.runs_here, default=here[0])
    p.add_argument("--record", metavar="DIR", help=argparse.SUPPRESS)  # the detached run a submit started
    _spec_flags(p)


def _job(p: argparse.ArgumentParser) -> None:
    """What status, cancel, logs and wait share: the job and how to reach its scheduler."""
    p.add_argument("job", metavar="HANDLE", help=f"job handle ({api.handle_forms()}) or a bare id with --backend")
    backend_choice(p, "the scheduler of a bare job id")
    backend_options(p)


def _status(p: argparse.ArgumentParser) -> None:
    _job(p)
    output_option(p)
    p.add_argument("--json", action="store_const", const="json", dest="output", help="same as -o json")
    p.add_argument("--follow", "-f", action="store_true", help="show it again every --interval s until the job ends")
    p.add_argument("--interval", type=float, default=5.0, help="with --follow: seconds between refreshes")


def _logs(p: argparse.ArgumentParser) -> None:
    _job(p)
    p.add_argument(
        "--rank",
        type=int,
        help="one rank's lines as it wrote them (its global rank); default: every rank's, each line [rank N]",
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")


def _plot(p: argparse.ArgumentParser) -> None:
    _job(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the picture to write (PNG, SVG, PDF)")


def _wait(p: argparse.ArgumentParser) -> None:
    _job(p)
    output_option(p)
    p.add_argument("--timeout", type=float, help="give up after SECONDS (exit 4)")


def _list(p: argparse.ArgumentParser) -> None:
    backend_choice(p, "the scheduler to ask", required=True)
    output_option(p)
    backend_options(p)


def _env(p: argparse.ArgumentParser) -> None:
    output_option(p)
    p.add_argument("--json", action="store_const", const="json", dest="output", help="same as -o json")


def _export(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "job",
        metavar="HANDLE_OR_RUN_DIR",
        help=f"the job's handle ({api.handle_forms()}), a bare id with --backend, or its run directory",
    )
    backend_choice(p, "the scheduler of a bare job id")
    backend_options(p)
    p.add_argument("--step", type=int, help="the checkpoint step-N to export (default: the newest committed)")
    p.add_argument("-o", "--output", required=True, help="model.pt (or model.safetensors, with that package)")


def _config(p: argparse.ArgumentParser) -> None:
    # `show` is a parser of its own, not a positional beside the spec: argparse would fill both
    # positionals at `show` and leave the spec of `config show --profile P job.yaml` unparsed
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", help="show: the merged spec")
    show = actions.add_parser("show", help="the merged spec and where each value came from")
    backend_choice(show, "the scheduler (or the profile's)")
    output_option(show)
    backend_options(show, lookup=False)
    _spec_flags(show)


def _completion(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "render": _render,
    "submit": _submit,
    "run": _run,
    "status": _status,
    "cancel": _job,
    "logs": _logs,
    "plot": _plot,
    "wait": _wait,
    "list": _list,
    "env": _env,
    "completion": _completion,
    "export": _export,
    "config": _config,
}


def _spec_flags(p: argparse.ArgumentParser) -> None:
    # the spec verbs' alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
    from dist_jobs.cli.flags import add_spec_flags

    add_spec_flags(p)


def output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=OUTPUT, default="table", help="table (default), json or yaml")


def option_dest(option: Any) -> str:
    """Where argparse puts a backend option's flag: one place per flag, whichever backend reads it."""
    return "backend_" + option.flag.lstrip("-").replace("-", "_")


def backend_options(p: argparse.ArgumentParser, lookup: bool = True) -> None:
    """Every backend's own options (dist_jobs.backends.base.Option), each flag once; without
    `lookup`, not those that only find a job (submit takes --namespace and --kind from the spec)."""
    added: set[str] = set()
    for cls in api.backend_classes():
        for option in cls.options:
            if option.flag in added or (option.lookup_only and not lookup):
                continue
            added.add(option.flag)
            p.add_argument(option.flag, dest=option_dest(option), choices=option.choices or None, help=option.help)
