"""`dist-jobs sweep`: submit one spec as many trials; `dist-jobs sweep status NAME`: their table.

    dist-jobs sweep --backend NAME job.yaml --grid train.lr=0.1,0.03 --grid train.batch_size=64,128 --max-parallel 2
    dist-jobs sweep status NAME [--metric eval_loss --mode min]
    dist-jobs sweep cancel NAME

`sweep status` and `sweep cancel` have a parser of their own (`sub_parser`): `dist-jobs sweep SPEC` takes the spec
as its positional, so `status` right after `sweep` is the verb, not a file name (write
`./status` for a spec file called that; the same for `cancel`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dist_jobs import api
from dist_jobs.api import sweep_submit as api_sweep
from dist_jobs.api.sweep_status import Sweep, manifest_path
from dist_jobs.cli.argv import Parser
from dist_jobs.cli.flags import _scalar, add_spec_flags, overrides_from
from dist_jobs.cli.output import columns, emit
from dist_jobs.constants import WAIT_EXIT_CODES
from dist_jobs.errors import UsageError
from dist_jobs.spec.sweep import parse_grid

USAGE_STATUS = (
    "dist-jobs sweep status NAME [--metric NAME] [--mode min|max] [--checkpoint-dir DIR]; "
    "dist-jobs sweep cancel NAME [--checkpoint-dir DIR]"
)


def add_sweep_parser(sub: Any, help_text: str, backend_options: Any, output_option: Any) -> None:
    p = sub.add_parser("sweep", help=help_text, epilog=f"Then: {USAGE_STATUS}")
    names = api.Names([cls.name for cls in api.backend_classes()])
    ways = "; ".join(f"{cls.name}: {cls.sweep_summary}" for cls in api.backend_classes())
    p.add_argument("--backend", choices=names, help=ways.replace("%", "%%"))  # argparse formats help with %
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a spec field and its values (repeatable; the trials are every combination); with --random also "
        "KEY=uniform:LO:HI, loguniform:LO:HI or int:LO:HI",
    )
    p.add_argument("--random", type=int, metavar="N", help="N trials drawn at random from the --grid values")
    p.add_argument("--seed", type=int, default=0, help="the seed of --random (default 0): the same trials each time")
    p.add_argument("--max-parallel", type=int, metavar="K", help="run at most K trials at once (how: see --backend)")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted; submit nothing")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for every trial to end, then print the status table to stderr; "
        "exit 0 if all succeeded, 1 if one failed, 3 if one was cancelled",
    )
    p.add_argument("--timeout", type=float, help="with --wait: give up after SECONDS (exit 4)")
    output_option(p)
    backend_options(p, lookup=False)
    add_spec_flags(p)


def sub_parser(verb: str) -> argparse.ArgumentParser:
    """`sweep status` and `sweep cancel`: NAME and where its manifest is."""
    descriptions = {
        "status": "One row per trial: parameters, state, step of total, latest and best metric; "
        "the best trial is marked *.",
        "cancel": "Stop a sweep: no trial starts any more and every trial not yet ended is cancelled.",
    }
    p = Parser(prog=f"dist-jobs sweep {verb}", description=descriptions[verb])
    p.add_argument("name", metavar="NAME", help="the sweep's name (its --name), or its folder or sweep.json")
    p.add_argument(
        "--checkpoint-dir", default="checkpoints", help="the spec's checkpoint_dir, where NAME/sweep.json is"
    )
    if verb == "cancel":
        return p
    p.add_argument("--metric", help="the metric to rank by (default: eval_loss where reported, else loss)")
    p.add_argument("--mode", choices=["min", "max"], default="min", help="min (default): lower is better")
    p.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table", help="table, json or yaml")
    return p


def cmd_sweep(args: argparse.Namespace, command: list[str] | None, options: dict[str, Any]) -> int:
    if not args.backend:
        raise UsageError("which backend runs the sweep?", f"pass --backend {api.or_list(api.backend_names())}")
    grid = parse_grid(args.grid, _scalar)
    overrides = overrides_from(args, command)
    call = (grid, args.random, args.seed, args.max_parallel, args.backend, overrides)
    if args.dry_run:
        sys.stdout.write(api_sweep.plan_sweep(args.spec, *call, **options).text)
        return 0
    submitted = api_sweep.sweep(args.spec, *call, **options)
    print(emit(submitted.manifest, args.output, _submitted_table(submitted)), flush=True)
    if not args.wait:
        return 0
    ended = submitted.wait(args.timeout)
    print(status_table(ended), file=sys.stderr)
    states = {r.state for r in ended}
    worst = next((s for s in ("failed", "cancelled") if s in states), "succeeded")
    return WAIT_EXIT_CODES[worst]


def _submitted_table(submitted: Any) -> str:
    rows = [[str(t["index"]), t["name"], str(t["handle"]), _params(t["params"])] for t in submitted.trials]
    table = columns(["TRIAL", "NAME", "HANDLE", "PARAMS"], rows)
    where = "" if _found_by_name(submitted) else f" --checkpoint-dir {submitted.path.parent.parent}"
    return (
        table
        + f"\nsweep {submitted.name}: {len(rows)} trials; see them: dist-jobs sweep status {submitted.name}{where}"
    )


def _found_by_name(submitted: Any) -> bool:
    """Whether `sweep status NAME`, run here without --checkpoint-dir, finds this sweep."""
    try:
        return manifest_path(submitted.name) == submitted.path.resolve()
    except UsageError:
        return False


def cmd_sweep_sub(verb: str, argv: list[str]) -> int:
    args = sub_parser(verb).parse_args(argv)
    sweep = Sweep.load(args.name, args.checkpoint_dir)
    if verb == "cancel":
        cancelled = sweep.cancel()
        print("\n".join(f"cancelled {h}" for h in cancelled) or f"sweep {sweep.name}: no trial left to cancel")
        return 0
    rows = sweep.status(args.metric, args.mode)
    print(emit([r.to_dict() for r in rows], args.output, status_table(rows)))
    return 0


def status_table(rows: list[Any]) -> str:
    """`  TRIAL NAME <one column per parameter> STATE STEP METRIC LATEST BEST`, the best row marked *."""
    keys = list(dict.fromkeys(k for r in rows for k in r.params))
    header = ["", "TRIAL", *keys, "STATE", "STEP", "METRIC", "LATEST", "BEST"]
    table = []
    for r in rows:
        step = "" if r.step is None else f"{r.step}/{r.total_steps if r.total_steps is not None else '?'}"
        values = [_value(r.params.get(k)) for k in keys]
        table.append(
            ["*" if r.is_best else " ", r.name, *values, r.state, step, r.metric or "", _num(r.latest), _num(r.best)]
        )
    return columns(header, table)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in params.items())


def _value(value: Any) -> str:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
