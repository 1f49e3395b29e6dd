"""A hang of a 2-process job on NCCL, and the Flight Recorder traces it leaves in the run directory.

    python bench/gpu_hang_flight_recorder.py --out DIR      # on a GPU machine: NCCL on cuda:0
    python bench/gpu_hang_flight_recorder.py --dry-run      # CPU here: the same on gloo

Starts the built-in trainer (`python -m dist_jobs.train`, the GPT) as two ranks with torch's env://
variables, as torchrun would. On one GPU the two ranks pose as two hosts (NCCL_HOSTID), since NCCL
refuses two ranks of one host on one device. Once rank 0's progress passes step 20, rank 1 is
stopped (SIGSTOP): rank 0 waits for it in an all_reduce, its hang watchdog fires, names rank 1 in
the HANG record and leaves its trace under `<run dir>/flight-recorder/`. Prints one JSON line
(the record, the traces, the last entries of rank 0's, torch's analyser's verdict) and copies
the traces, the record and the ranks' logs into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU and gloo: checks the script here")
    p.add_argument("--out", type=Path, default=None, help="where the traces, record and logs are copied")
    p.add_argument("--stop-at", type=int, default=20, help="the step after which rank 1 is stopped")
    return p.parse_args()


def rank_env(rank: int, port: int, dry: bool) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "DIST_JOBS_BACKEND": "local"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
    env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank), DIST_JOBS_ENV="torchrun")
    if not dry:
        env["NCCL_HOSTID"] = f"posing-host-{rank}"  # two "hosts" on one GPU: NCCL's duplicate-GPU check
    return env


def flags(root: Path, dry: bool) -> list[str]:
    return [
        *("--model", "gpt", "--data", "text", "--epochs", "100", "--batch-size", "8"),
        *("--device", "cpu" if dry else "cuda", "--checkpoint-dir", str(root), "--run-name", "frcheck"),
        *("--checkpoint-every-steps", "1000", "--log-every", "5", "--hang-min-seconds", "5"),
        *("--hang-factor", "10", "--collective-timeout", "120", "--max-steps", "100000"),
    ]


def step_of(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def wait_until(what: str, ready: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def last_entries(trace: Path, n: int = 3) -> list[dict[str, Any]]:
    """The newest entries of a trace this script's own run just wrote (torch's pickle format)."""
    dump = pickle.loads(trace.read_bytes())
    keep = ("profiling_name", "collective_seq_id", "state", "process_group", "input_sizes")
    return [{k: e.get(k) for k in keep} for e in dump["entries"][-n:]]


def analyse(folder: Path) -> str:
    """torch's analyser, first as it stands (it names the ranks whose trace is missing), then
    allowing for them (what the others' traces say)."""
    argv = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "--prefix", "rank"]
    return "\n".join(_run(command) for command in (argv, [*argv, "--allow-incomplete-ranks"]))


def _run(argv: list[str]) -> str:
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (proc.stdout + proc.stderr)[-4000:]


def main() -> None:
    args = parse()
    root = Path(tempfile.mkdtemp(prefix="frcheck-"))
    run_dir = root / "frcheck"
    logs = [root / f"rank{r}.log" for r in (0, 1)]
    argv = [sys.executable, "-m", "dist_jobs.train", *flags(root, args.dry_run)]
    ranks = [
        subprocess.Popen(argv, env=rank_env(r, 29617, args.dry_run), stdout=logs[r].open("w"), stderr=subprocess.STDOUT)
        for r in (0, 1)
    ]
    try:
        wait_until(f"step {args.stop_at}", lambda: step_of(run_dir) >= args.stop_at or ranks[0].poll() is not None, 600)
        os.kill(ranks[1].pid, signal.SIGSTOP)
        stopped_at = step_of(run_dir)
        code = ranks[0].wait(timeout=300)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
    traces = sorted((run_dir / "flight-recorder").glob("*/rank*"))
    hang = run_dir / "HANG"
    report = {
        "device": "cpu (gloo)" if args.dry_run else "cuda (nccl)",
        "rank0_exit": code,
        "stopped_after_step": stopped_at,
        "hang": json.loads(hang.read_text()) if hang.exists() else None,
        "traces": [str(t.relative_to(run_dir)) for t in traces],
        "rank0_last_entries": last_entries(traces[0]) if traces else [],
    }
    print(json.dumps(report, default=str))
    print(analyse(traces[0].parent) if traces else "no trace: " + logs[0].read_text()[-3000:])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for path in [*traces, *logs, *([hang] if hang.exists() else [])]:
            shutil.copy(path, args.out / path.name)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
