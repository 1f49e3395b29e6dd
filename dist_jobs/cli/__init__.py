"""`dist-jobs`: the only module that prints and exits.

Every typed error becomes its message and hint on stderr with its exit code (2 for bad input);
only a bug shows a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dist_jobs.cli.flags import add_spec_flags, split_command
from dist_jobs.constants import VERSION
from dist_jobs.errors import DistJobsError

_VERBS = {
    "render": "print the sbatch script or Kubernetes manifest",
    "submit": "submit the job (--dry-run prints what would be submitted)",
    "run": "run the job here as local processes (gloo on CPU without GPUs)",
    "status": "show a job's state",
    "cancel": "cancel a job",
    "logs": "print a job's logs",
    "list": "list dist-jobs jobs",
    "env": "print the ranks this process resolves (run it under srun/torchrun)",
    "schema": "print the job spec's JSON Schema (for editor completion of job.yaml)",
}


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
    for name, text in _VERBS.items():
        p = sub.add_parser(name, help=text)
        if verb in (None, name):
            _verb_arguments(name, p)
    return parser


def _verb_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    if verb in ("render", "submit"):
        what = "slurm: sbatch script; k8s: manifest" if verb == "render" else "the scheduler to submit to"
        p.add_argument("--backend", choices=["slurm", "k8s"], required=True, help=what)
    if verb == "render":
        p.add_argument("-o", "--output", help="write to FILE instead of stdout")
    if verb == "submit":
        p.add_argument("--dry-run", action="store_true", help="print the exact payload; submit nothing")
        _backend_options(p, namespace=False)
    if verb == "run":
        p.add_argument("--backend", choices=["local"], default="local", help="local processes (the only choice)")
    if verb in ("render", "submit", "run"):
        add_spec_flags(p)
    if verb in ("status", "cancel", "logs", "list"):
        p.add_argument("--backend", choices=["slurm", "k8s"], required=True, help="the job's scheduler")
        if verb != "list":
            p.add_argument("job", help="job id (SLURM) or job name (Kubernetes)")
        _backend_options(p)
    if verb == "status":
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
    if verb == "logs":
        p.add_argument("--rank", type=int, help="SLURM: global rank; Kubernetes: pod rank (default 0)")
        p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    if verb == "env":
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _backend_options(p: argparse.ArgumentParser, namespace: bool = True) -> None:
    if namespace:  # submit takes the namespace and the kind from the spec (its --namespace is a spec flag)
        p.add_argument("--namespace", dest="k8s_namespace", help="Kubernetes namespace (default: 'default')")
        p.add_argument(
            "--kind",
            dest="k8s_kind",
            choices=["PyTorchJob", "TrainJob"],
            default="PyTorchJob",
            help="Kubernetes: the job's kind (default PyTorchJob)",
        )
    p.add_argument("--context", dest="k8s_context", help="kubeconfig context")
    p.add_argument(
        "--kubeconfig", dest="k8s_kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    p.add_argument("--jobs-dir", dest="jobs_dir", help="SLURM: where job directories go (default: ./dist-jobs-runs)")


def main(argv: Sequence[str] | None = None) -> int:
    own, command = split_command(list(sys.argv[1:] if argv is None else argv))
    args = _parser(next((a for a in own if not a.startswith("-")), None)).parse_args(own)
    if command is not None and args.verb not in ("render", "submit", "run"):
        print(f"dist-jobs {args.verb}: a command after `--` only goes with render, submit or run", file=sys.stderr)
        return 2
    try:
        from dist_jobs.cli.commands import COMMANDS

        return COMMANDS[args.verb](args, command)
    except DistJobsError as exc:
        print(f"dist-jobs {args.verb}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dist-jobs {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
