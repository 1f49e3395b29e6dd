"""The verbs of `dist-jobs`: each takes the parsed arguments and returns an exit code.

They print; only `dist_jobs.cli.main` turns errors into messages and exit codes.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dist_jobs import api
from dist_jobs.cli.output import columns, emit, info_table
from dist_jobs.cli.parser import option_dest
from dist_jobs.constants import WAIT_EXIT_CODES
from dist_jobs.errors import DistJobsError, Problem, SpecError, UsageError


def _load(args: argparse.Namespace, command: list[str] | None) -> Any:
    # the spec verbs' alone (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
    from dist_jobs.cli.flags import overrides_from

    profile = apply_profile(args)
    flagged: list[Problem] = []
    overrides = overrides_from(args, command, flagged)
    return _with_flag_problems(
        flagged, lambda: api.load_spec(args.spec, overrides, backend=args.backend, defaults=profile.spec)
    )


def _with_flag_problems(flagged: list[Problem], load: Callable[[], Any]) -> Any:
    """The loaded spec, or one SpecError with the command line's problems (`flagged`) and the
    spec's, all at once; the command line's named as such, not as the file's."""
    try:
        spec = load()
    except SpecError as exc:
        if not flagged:
            raise
        raise SpecError(flagged + exc.problems, f"{exc.source} and the command line") from None
    if flagged:
        raise SpecError(flagged, "command line")
    return spec


def apply_profile(args: argparse.Namespace) -> Any:
    """The chosen profile (dist_jobs.spec.profiles); its backend, context and kubeconfig fill in
    the flags not given (flags win). Without a backend from either: a usage error."""
    # the spec verbs' and sweep's (the query verbs' 150 ms budget, bench/bench_cli_verbs.py)
    from dist_jobs.spec.profiles import load_profile

    classes = api.backend_classes()
    schedulers = {cls.name: [o.name for o in cls.options if not o.lookup_only] for cls in classes}
    profile = load_profile(getattr(args, "profile", None), schedulers=schedulers)
    given = {"backend": "backend", **{o.name: option_dest(o) for cls in classes for o in cls.options}}
    for option, dest in given.items():
        if getattr(args, dest, None) is None and option in profile.options and hasattr(args, dest):
            setattr(args, dest, profile.options[option])
    if getattr(args, "backend", "") is None and args.verb not in ("sweep", "config"):
        raise UsageError(
            "which scheduler? no --backend, and no profile gives a backend",  # cli.main prefixes the verb
            f"pass --backend {api.or_list(api.backend_names())}, or choose a profile with `backend:` (--profile NAME)",
        )
    return profile


def _options(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The flags of `backend`'s own options given, as its constructor takes them."""
    if not backend:
        return {}
    options = api.backend_class(backend).options
    given = {o: getattr(args, option_dest(o), None) for o in options}
    return {o.name: o.kind(value) for o, value in given.items() if value is not None}


def _backend(args: argparse.Namespace) -> Any:
    return api.backend(args.backend, **_options(args, args.backend))


def _job(args: argparse.Namespace) -> Any:
    """The Job of `HANDLE`, or of a bare id with --backend."""
    backend = api.parse_handle(args.job).backend if api.is_handle(args.job) else args.backend
    return api.job(args.job, backend, **(_options(args, backend) if backend else {}))


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
    if args.dry_run:
        backend = _backend(args)
        prepared = backend.prepare(spec)
        sys.stdout.write(prepared.payload)
        if prepared.snapshot is not None:  # the folder the payload runs in, which submit makes
            where = prepared.snapshot
            print(f"# snapshot: submit copies the code in {where.source} to {where.dest}", file=sys.stderr)
        said = backend.check(prepared)
        if said is not None:
            print(f"# server-side dry run: {said}", file=sys.stderr)
        return 0
    job = api.submit(spec, args.backend, **_options(args, args.backend))
    record = {"handle": job.handle, "backend": args.backend, "id": job.id, "name": spec.run_id}
    print(emit(record, args.output, job.handle), flush=True)
    if not (args.wait or args.follow):
        return 0
    if args.follow:
        for line in job.follow(job.log_ranks(spec)):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    return _ended(job.wait(args.timeout), args.output, stream=sys.stderr)


def _ended(info: Any, fmt: str, stream: Any = None) -> int:
    print(emit(info.to_dict(), fmt, info_table(info)), file=stream or sys.stdout)
    return WAIT_EXIT_CODES.get(info.state.value, WAIT_EXIT_CODES["failed"])


def cmd_run(args: argparse.Namespace, command: list[str] | None) -> int:
    record = Path(args.record) if args.record else None  # the detached run a submit started
    return api.backend(args.backend).foreground(_load(args, command), record)


def cmd_status(args: argparse.Namespace, _: Any) -> int:
    if args.follow and not args.interval > 0:
        raise UsageError(f"--interval {args.interval:g}: must be more than 0 seconds", "e.g. --interval 5")
    job = _job(args)
    info = job.status()
    print(emit(info.to_dict(), args.output, info_table(info)), flush=True)
    if not args.follow:
        return 0
    # --follow: again every --interval seconds until the job has ended; Ctrl-C ends it with 130
    # (cli.main), like any interrupted verb. On a terminal the table is redrawn in place.
    redraw = args.output == "table" and sys.stdout.isatty()
    while not info.finished:
        time.sleep(args.interval)
        info = job.status()
        text = emit(info.to_dict(), args.output, info_table(info))
        print(("\x1b[H\x1b[J" if redraw else "") + text, flush=True)
    return 0


def cmd_wait(args: argparse.Namespace, _: Any) -> int:
    return _ended(_job(args).wait(args.timeout), args.output)


def cmd_list(args: argparse.Namespace, _: Any) -> int:
    infos = api.list_jobs(args.backend, **_options(args, args.backend))
    rows = [[i.handle, i.name, str(i.state), i.word, i.detail] for i in infos]
    table = columns(["HANDLE", "NAME", "STATE", "SCHEDULER", "DETAIL"], rows)
    print(emit([i.to_dict() for i in infos], args.output, table))
    return 0


def cmd_cancel(args: argparse.Namespace, _: Any) -> int:
    job = _job(args)
    job.cancel()
    # A scheduler stops a job in its own time (the ranks checkpoint first): "cancelled" only once
    # it has ended, as `status` would then say.
    if _gone_or_finished(job):
        print(f"cancelled {job.handle}")
    else:
        print(f"stopping {job.handle} (cancelled; `dist-jobs wait {job.handle}` returns once it has stopped)")
    return 0


def _gone_or_finished(job: Any) -> bool:
    """After a cancel: whether the job has ended, or is gone (a scheduler that deletes a
    cancelled job may no longer find it at all)."""
    try:
        return bool(job.status().finished)
    except DistJobsError:
        return True


def cmd_logs(args: argparse.Namespace, _: Any) -> int:
    for line in _job(args).logs(rank=args.rank, follow=args.follow):
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
        sys.stdout.flush()
    return 0


def cmd_plot(args: argparse.Namespace, _: Any) -> int:
    print(_job(args).plot(args.output))
    return 0


def cmd_env(args: argparse.Namespace, _: Any) -> int:
    # `env` alone: every verb imports this module, and the ranks' (socket, random) would count
    # against render's start-up budget (bench/bench_render.py)
    from dist_jobs.ranks import resolve
    from dist_jobs.ranks.report import as_json, as_table
    from dist_jobs.ranks.selfcheck import check

    info = resolve()
    print(emit(json.loads(as_json(info)), args.output, as_table(info)))
    check(info)  # printed first, so a launch that does not add up is still visible; then exit 3
    return 0


def cmd_schema(args: argparse.Namespace, _: Any) -> int:
    from dist_jobs.spec import json_schema  # msgspec: the query verbs load no spec classes (test_imports)

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def cmd_sweep(args: argparse.Namespace, command: list[str] | None) -> int:
    from dist_jobs.cli.sweep import cmd_sweep as sweep  # a sweep's modules are for `sweep` alone (test_imports)

    profile = apply_profile(args)
    if profile.spec:  # the profile's fields under job.yaml's (the sweep reads data as a spec file)
        from dist_jobs.spec.load import read_yaml  # msgspec, yaml: not for the query verbs (test_imports)
        from dist_jobs.spec.profiles import merge

        args.spec = merge(merge({}, profile.spec), read_yaml(Path(args.spec)) if args.spec else {})
    return sweep(args, command, _options(args, args.backend or ""))


def cmd_export(args: argparse.Namespace, _: Any) -> int:
    """In a child process: reading a checkpoint needs torch, which the CLI never imports."""
    import subprocess  # `export` alone: render, which imports this module, runs no command (bench_render)

    # a handle (or a bare id with --backend) names its run directory through its backend
    run_dir = str(_job(args).run_dir) if api.is_handle(args.job) or args.backend else args.job
    argv = [sys.executable, "-m", "dist_jobs.train.checkpoint.export", run_dir, "-o", args.output]
    argv += ["--step", str(args.step)] if args.step is not None else []
    # Its lines pass through this process, where the CLI's own output goes (a notebook, a capture).
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    print(done.stdout, end="")
    print(done.stderr, end="", file=sys.stderr)
    return done.returncode


def cmd_config(args: argparse.Namespace, command: list[str] | None) -> int:
    """`dist-jobs config show [--profile P] [job.yaml] [flags]`: the merged spec, each value with
    where it came from (config defaults, the profile, job.yaml, a flag, or the built-in default)."""
    import msgspec  # with read_yaml: the query verbs load no msgspec or yaml (test_imports)

    from dist_jobs.cli.flags import overrides_from  # the spec verbs' alone (budget, as above)
    from dist_jobs.spec.load import read_yaml
    from dist_jobs.spec.profiles import leaves

    profile = apply_profile(args)
    flagged: list[Problem] = []
    overrides = overrides_from(args, command, flagged)
    spec = _with_flag_problems(
        flagged, lambda: api.load_spec(args.spec, overrides, backend=args.backend, defaults=profile.spec)
    )
    sources = dict(profile.sources)
    sources.update(dict.fromkeys(leaves(read_yaml(Path(args.spec))) if args.spec else [], str(args.spec)))
    sources.update(dict.fromkeys(overrides, "flag"))
    merged = msgspec.to_builtins(spec)
    rows = [{"field": "backend", "value": args.backend, "from": _source(sources, "backend", args.backend)}]
    for option, value in _given_options(args).items():
        rows.append({"field": option, "value": value, "from": _source(sources, option, "flag")})
    rows += [{"field": f, "value": _at(merged, f), "from": _source(sources, f, None)} for f in leaves(merged)]
    table = columns(["FIELD", "VALUE", "FROM"], [[r["field"], _shown(r["value"]), r["from"]] for r in rows])
    print(emit(rows, args.output, table))
    return 0


def _given_options(args: argparse.Namespace) -> dict[str, str]:
    """Each backend option given (by a flag or the profile), whichever backend reads it."""
    options = [o for cls in api.backend_classes() for o in cls.options]
    given = {o.name: getattr(args, option_dest(o), None) for o in options}
    return {name: value for name, value in given.items() if value}


def _source(sources: dict[str, str], field: str, value: Any) -> str:
    found = sources.get(field)
    while found is None and "." in field:  # a whole mapping set in one place (env: {...})
        field = field.rsplit(".", 1)[0]
        found = sources.get(field)
    return found or ("flag" if value == "flag" else "default")


def _at(data: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        data = data[key]
    return data


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


COMMANDS: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "render": cmd_render,
    "submit": cmd_submit,
    "run": cmd_run,
    "status": cmd_status,
    "list": cmd_list,
    "cancel": cmd_cancel,
    "logs": cmd_logs,
    "plot": cmd_plot,
    "wait": cmd_wait,
    "env": cmd_env,
    "schema": cmd_schema,
    "sweep": cmd_sweep,
    "export": cmd_export,
    "config": cmd_config,
}
