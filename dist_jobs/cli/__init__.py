"""`dist-jobs`: the only module that prints and exits.

Every typed error becomes its message and hint on stderr with its exit code (2 for bad input);
only a bug shows a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dist_jobs.cli.flags import add_spec_flags, split_command
from dist_jobs.constants import VERSION
from dist_jobs.errors import DistJobsError

OUTPUT = ("table", "json", "yaml")
SWEEP_HELP = "submit a grid or random search of one spec: one trial per set of values (then: sweep status NAME)"
JOB_HELP = "job handle (slurm://CLUSTER/ID, k8s://NAMESPACE/KIND/NAME, local:///RUN/DIR) or a bare id with --backend"


def _parser(verb: str | None = None) -> argparse.ArgumentParser:
    """Every verb, with the arguments of `verb` only (of all, when None): `render` is start-up
    bound, and argparse's per-argument work for the other verbs' ~100 flags was a tenth of it."""
    parser = argparse.ArgumentParser(
        prog="dist-jobs",
        description="One job spec: SLURM sbatch script, Kubeflow PyTorchJob, or local processes.",
        epilog="A command after `--` replaces the default training entrypoint.",
    )
    parser.add_argument("--version", action="version", version=f"dist-jobs {VERSION}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="print the sbatch script or Kubernetes manifest")
    p.add_argument("--backend", choices=["slurm", "k8s"], required=True, help="slurm: sbatch script; k8s: manifest")
    p.add_argument("-o", "--output", help="write to FILE instead of stdout")
    if verb in (None, "render"):  # the spec flags are most of the parser's build time
        add_spec_flags(p)

    _submit_parser(sub, spec_flags=verb in (None, "submit"))

    p = sub.add_parser("run", help="run the job here as local processes (gloo on CPU without GPUs)")
    p.add_argument("--backend", choices=["local"], default="local", help="local processes (the only choice)")
    p.add_argument("--record", metavar="DIR", help=argparse.SUPPRESS)  # submit --backend local's detached run
    if verb in (None, "run"):
        add_spec_flags(p)

    _job_parsers(sub)

    p = sub.add_parser("list", help="list dist-jobs jobs")
    p.add_argument("--backend", choices=["slurm", "k8s", "local"], required=True, help="the scheduler to ask")
    _output_option(p)
    _backend_options(p)

    p = sub.add_parser("env", help="print the ranks this process resolves (run it under srun/torchrun)")
    _output_option(p)
    p.add_argument("--json", action="store_const", const="json", dest="output", help="same as -o json")
    sub.add_parser("schema", help="print the job spec's JSON Schema (for editor completion of job.yaml)")
    p = sub.add_parser("completion", help='print a shell completion script: eval "$(dist-jobs completion bash)"')
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    if verb in (None, "sweep"):
        from dist_jobs.cli.sweep import add_sweep_parser

        add_sweep_parser(sub, SWEEP_HELP, _backend_options, _output_option)
    else:  # listed in the help; its own parser (and module) only for `dist-jobs sweep ...`
        sub.add_parser("sweep", help=SWEEP_HELP)
    return parser


def _submit_parser(sub: Any, spec_flags: bool) -> None:
    p = sub.add_parser("submit", help="submit the job (--dry-run prints what would be submitted)")
    p.add_argument(
        "--backend", choices=["slurm", "k8s", "local"], required=True, help="the scheduler (local: detached processes)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the exact payload; submit nothing")
    p.add_argument(
        "--wait", action="store_true", help="wait for the job to end; exit 0 if it succeeded, 1 if it failed"
    )
    p.add_argument(
        "--follow", "-f", action="store_true", help="print every rank's log as it is written (implies --wait)"
    )
    p.add_argument("--timeout", type=float, help="with --wait: give up after SECONDS (exit 4)")
    _output_option(p)
    _backend_options(p, namespace=False)
    if spec_flags:
        add_spec_flags(p)


def _job_parsers(sub: Any) -> None:
    verbs = {
        "status": "show a job's state (normalised and the scheduler's word), which rank failed, and its progress",
        "cancel": "cancel a job",
        "logs": "print a job's logs",
        "wait": "wait for a job to end; exit 0 if it succeeded, 1 failed, 3 cancelled, 4 timeout",
    }
    for verb, text in verbs.items():
        p = sub.add_parser(verb, help=text)
        p.add_argument("job", metavar="HANDLE", help=JOB_HELP)
        p.add_argument("--backend", choices=["slurm", "k8s", "local"], help="the scheduler of a bare job id")
        _backend_options(p)
        if verb in ("status", "wait"):
            _output_option(p)
        if verb == "status":
            p.add_argument("--json", action="store_const", const="json", dest="output", help="same as -o json")
            p.add_argument(
                "--follow", "-f", action="store_true", help="show it again every --interval s until the job ends"
            )
            p.add_argument("--interval", type=float, default=5.0, help="with --follow: seconds between refreshes")
        if verb == "wait":
            p.add_argument("--timeout", type=float, help="give up after SECONDS (exit 4)")
        if verb == "logs":
            p.add_argument("--rank", type=int, help="SLURM: global rank; Kubernetes: pod rank (default 0; local: all)")
            p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")


def _output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=OUTPUT, default="table", help="table (default), json or yaml")


def _backend_options(p: argparse.ArgumentParser, namespace: bool = True) -> None:
    if namespace:  # submit takes the namespace and the kind from the spec (its --namespace is a spec flag)
        p.add_argument("--namespace", dest="k8s_namespace", help="Kubernetes namespace (default: 'default')")
        p.add_argument(
            "--kind",
            dest="k8s_kind",
            choices=["PyTorchJob", "TrainJob"],
            help="Kubernetes: the kind of a bare job name (default PyTorchJob; a handle carries its kind; list: both)",
        )
    p.add_argument("--context", dest="k8s_context", help="kubeconfig context")
    p.add_argument(
        "--kubeconfig", dest="k8s_kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    p.add_argument("--jobs-dir", dest="jobs_dir", help="SLURM: where job directories go (default: ./dist-jobs-runs)")


def main(argv: Sequence[str] | None = None) -> int:
    own, command = split_command(list(sys.argv[1:] if argv is None else argv))
    if own[:1] == ["sweep"] and own[1:2] in (["status"], ["cancel"]):  # `sweep SPEC` takes a positional
        from dist_jobs.cli.sweep import cmd_sweep_sub

        return _guarded(f"sweep {own[1]}", lambda: cmd_sweep_sub(own[1], own[2:]))
    args = _parser(next((a for a in own if not a.startswith("-")), None)).parse_args(own)
    if command is not None and args.verb not in ("render", "submit", "run", "sweep"):
        print(
            f"dist-jobs {args.verb}: a command after `--` only goes with render, submit, run or sweep", file=sys.stderr
        )
        return 2
    if args.verb == "completion":  # it reads the parser, which lives here
        from dist_jobs.cli.completion import script

        sys.stdout.write(script(_parser(), args.shell))
        return 0
    from dist_jobs.cli.commands import COMMANDS

    return _guarded(args.verb, lambda: COMMANDS[args.verb](args, command))


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
