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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dist-jobs",
        description="One job spec: SLURM sbatch script, Kubeflow PyTorchJob, or local processes.",
        epilog="A command after `--` replaces the default training entrypoint.",
    )
    parser.add_argument("--version", action="version", version=f"dist-jobs {VERSION}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="print the sbatch script or Kubernetes manifest")
    p.add_argument("--backend", choices=["slurm", "k8s"], required=True)
    p.add_argument("-o", "--output", help="write to FILE instead of stdout")
    add_spec_flags(p)

    p = sub.add_parser("submit", help="submit the job (--dry-run prints what would be submitted)")
    p.add_argument("--backend", choices=["slurm", "k8s"], required=True)
    p.add_argument("--dry-run", action="store_true", help="print the exact payload; submit nothing")
    _backend_options(p, namespace=False)
    add_spec_flags(p)

    p = sub.add_parser("run", help="run the job here as local processes (gloo on CPU without GPUs)")
    p.add_argument("--backend", choices=["local"], default="local")
    add_spec_flags(p)

    for verb, text in (("status", "show a job's state"), ("cancel", "cancel a job"), ("logs", "print a job's logs")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("--backend", choices=["slurm", "k8s"], required=True)
        p.add_argument("job", help="job id (SLURM) or job name (Kubernetes)")
        _backend_options(p)
        if verb == "status":
            p.add_argument("--json", action="store_true")
        if verb == "logs":
            p.add_argument("--rank", type=int, help="SLURM: global rank; Kubernetes: pod rank (default 0)")
            p.add_argument("--follow", "-f", action="store_true")

    p = sub.add_parser("list", help="list dist-jobs jobs")
    p.add_argument("--backend", choices=["slurm", "k8s"], required=True)
    _backend_options(p)

    p = sub.add_parser("env", help="print the ranks this process resolves (run it under srun/torchrun)")
    p.add_argument("--json", action="store_true")
    sub.add_parser("schema", help="print the job spec's JSON Schema (for editor completion of job.yaml)")
    return parser


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
    args = _parser().parse_args(own)
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
