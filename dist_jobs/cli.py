"""`dist-jobs`: the only module that prints and exits.

Every typed error becomes its message and hint on stderr with its exit code (2 for bad input);
only a bug shows a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from dist_jobs import __version__
from dist_jobs.cli_flags import add_spec_flags, overrides_from, split_command
from dist_jobs.errors import DistJobsError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dist-jobs", description="One job spec: SLURM sbatch script, Kubeflow PyTorchJob, or local processes.",
        epilog="A command after `--` replaces the default training entrypoint.")
    parser.add_argument("--version", action="version", version=f"dist-jobs {__version__}")
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
    if namespace:  # submit takes the namespace from the spec (its --namespace is a spec flag)
        p.add_argument("--namespace", dest="k8s_namespace", help="Kubernetes namespace (default: 'default')")
    p.add_argument("--context", dest="k8s_context", help="kubeconfig context")
    p.add_argument("--kubeconfig", dest="k8s_kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--jobs-dir", dest="jobs_dir", help="SLURM: where job directories go (default: ./dist-jobs-runs)")


def _load(args: argparse.Namespace, command: list[str] | None) -> Any:
    from dist_jobs.spec_load import load_spec

    return load_spec(args.spec, overrides_from(args, command))


def _backend(args: argparse.Namespace) -> Any:
    from dist_jobs.backends.base import get_backend

    options: dict[str, Any] = {}
    if args.backend == "k8s":
        options = {"namespace": getattr(args, "k8s_namespace", None), "context": args.k8s_context, "kubeconfig": args.k8s_kubeconfig}
    elif args.backend == "slurm" and getattr(args, "jobs_dir", None):
        options = {"jobs_dir": Path(args.jobs_dir)}
    return get_backend(args.backend, **options)


def _write(text: str, output: str | None) -> None:
    if not output:
        sys.stdout.write(text)
        return
    path = Path(output)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def cmd_render(args: argparse.Namespace, command: list[str] | None) -> int:
    from dist_jobs.render import render

    _write(render(_load(args, command), args.backend), args.output)
    return 0


def cmd_submit(args: argparse.Namespace, command: list[str] | None) -> int:
    spec = _load(args, command)
    backend = _backend(args)
    prepared = backend.prepare(spec)
    if args.dry_run:
        sys.stdout.write(prepared.payload)
        check = getattr(backend, "server_dry_run", None)
        if args.backend == "k8s" and check is not None:
            print(f"# server-side dry run: {check(prepared)}", file=sys.stderr)
        return 0
    job_id = backend.submit(prepared)
    print(job_id)
    return 0


def cmd_run(args: argparse.Namespace, command: list[str] | None) -> int:
    from dist_jobs.backends.local import LocalBackend

    return LocalBackend().run(_load(args, command))


def cmd_status(args: argparse.Namespace, _: Any) -> int:
    status = _backend(args).status(args.job)
    if args.json:
        print(json.dumps({"job_id": status.job_id, "name": status.name, "state": status.state,
                          "detail": status.detail, **status.extra}, indent=2))
    else:
        print(f"{status.job_id}  {status.name}  {status.state}" + (f"  {status.detail}" if status.detail else ""))
        for key, value in status.extra.items():
            print(f"  {key}: {value}")
    return 0


def cmd_list(args: argparse.Namespace, _: Any) -> int:
    for status in _backend(args).list():
        print(f"{status.job_id}\t{status.name}\t{status.state}\t{status.detail}")
    return 0


def cmd_cancel(args: argparse.Namespace, _: Any) -> int:
    _backend(args).cancel(args.job)
    print(f"cancelled {args.job}")
    return 0


def cmd_logs(args: argparse.Namespace, _: Any) -> int:
    for line in _backend(args).logs(args.job, rank=args.rank, follow=args.follow):
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
        sys.stdout.flush()
    return 0


def cmd_env(args: argparse.Namespace, _: Any) -> int:
    from dist_jobs.ranks import resolve
    from dist_jobs.ranks.report import as_json, as_table

    info = resolve()
    print(as_json(info) if args.json else as_table(info))
    return 0


def cmd_schema(args: argparse.Namespace, _: Any) -> int:
    from dist_jobs.spec import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "render": cmd_render, "submit": cmd_submit, "run": cmd_run, "status": cmd_status, "list": cmd_list,
    "cancel": cmd_cancel, "logs": cmd_logs, "env": cmd_env, "schema": cmd_schema,
}


def main(argv: Sequence[str] | None = None) -> int:
    own, command = split_command(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(own)
    if command is not None and args.verb not in ("render", "submit", "run"):
        print(f"dist-jobs {args.verb}: a command after `--` only goes with render, submit or run", file=sys.stderr)
        return 2
    try:
        return COMMANDS[args.verb](args, command)
    except DistJobsError as exc:
        print(f"dist-jobs {args.verb}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"dist-jobs {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
