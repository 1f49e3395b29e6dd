"""The verbs of `dist-jobs`: each takes the parsed arguments and returns an exit code.

They print; only `dist_jobs.cli.main` turns errors into messages and exit codes.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dist_jobs import api
from dist_jobs.cli.flags import overrides_from
from dist_jobs.errors import UsageError


def _load(args: argparse.Namespace, command: list[str] | None) -> Any:
    return api.load_spec(args.spec, overrides_from(args, command), backend=args.backend)


def _backend(args: argparse.Namespace) -> Any:
    options: dict[str, Any] = {}
    if args.backend == "k8s":
        options = {
            "namespace": getattr(args, "k8s_namespace", None),
            "context": args.k8s_context,
            "kubeconfig": args.k8s_kubeconfig,
            **({"kind": args.k8s_kind} if getattr(args, "k8s_kind", None) else {}),
        }
    elif args.backend == "slurm" and getattr(args, "jobs_dir", None):
        options = {"jobs_dir": Path(args.jobs_dir)}
    return api.backend(args.backend, **options)


def _write(text: str, output: str | None) -> None:
    """`-o PATH` writes through PATH as the shell's `> PATH` does: a symlink's target, a device or
    a pipe gets the text, and nothing is replaced. A FIFO nobody reads is refused, not waited on."""
    if not output:
        sys.stdout.write(text)
        return
    data = text.encode()
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY, 0o666)
    except OSError as exc:
        raise UsageError(f"-o {output}: cannot write there: {exc.strerror}", _output_hint(exc)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.set_blocking(fd, True)  # non-blocking was for the open only: write all of it
            fh.write(data)
    except OSError as exc:
        raise UsageError(f"-o {output}: writing failed: {exc.strerror}", "check the disk and the path") from None


def _output_hint(exc: OSError) -> str:
    return {
        errno.EISDIR: "give a file name, e.g. -o job.sbatch",
        errno.ENOENT: "create the folder first, or write into an existing one",
        errno.ENXIO: "it is a FIFO that no process reads: start the reader first",
        errno.EACCES: "pick a path you may write",
    }.get(exc.errno or 0, "check the path")


def cmd_render(args: argparse.Namespace, command: list[str] | None) -> int:
    _write(api.render(_load(args, command), args.backend), args.output)
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
    return api.run_local(_load(args, command))


def cmd_status(args: argparse.Namespace, _: Any) -> int:
    status = _backend(args).status(args.job)
    if args.json:
        import json

        print(
            json.dumps(
                {
                    "job_id": status.job_id,
                    "name": status.name,
                    "state": status.state,
                    "detail": status.detail,
                    **status.extra,
                },
                indent=2,
            )
        )
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
    from dist_jobs.ranks.selfcheck import check

    info = resolve()
    print(as_json(info) if args.json else as_table(info))
    check(info)  # printed first, so a launch that does not add up is still visible; then exit 3
    return 0


def cmd_schema(args: argparse.Namespace, _: Any) -> int:

    from dist_jobs.spec import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "render": cmd_render,
    "submit": cmd_submit,
    "run": cmd_run,
    "status": cmd_status,
    "list": cmd_list,
    "cancel": cmd_cancel,
    "logs": cmd_logs,
    "env": cmd_env,
    "schema": cmd_schema,
}
