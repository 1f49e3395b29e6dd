"""`python -m dist_jobs.backends.slurm.nodecheck RUN_DIR NONCE [--gpus N]`: whether this node can
run the job's ranks; one task per node of the allocation runs it (step_end's probe), before the
step starts and before a restart in place.

A node that answers SLURM can still be unfit for the job, and its ranks would do harm there: one
whose shared filesystem is not mounted (or is a stale mount) sees an empty run directory, so its
ranks start from scratch while the others resume, and write their checkpoint shards where no
other node will ever read them. So each node reads back the nonce the batch shell wrote into the
run directory just before (`NONCE_FILE`), writes a file of its own there, and, for a GPU job,
lists its GPUs (`nvidia-smi -L`, which hangs or fails on a GPU that fell off the bus). It prints
one line, `NODE<TAB>ok` or `NODE<TAB>what is wrong`, and exits 0 either way: the line is the answer.
Stdlib only: it runs with the batch script's python on every node, before any rank.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

NONCE_FILE = ".nodecheck"  # in the run directory: written by the batch host, read back by every node
OK = "ok"
NOT_SHARED = "is not the directory the batch host sees"  # the nonce check's failure, as a report says it
GPU_LIST_SECONDS = 20  # nvidia-smi on a healthy node answers in well under a second


def check(run_dir: Path, nonce: str, gpus: int = 0, host: str = "") -> str:
    """What makes this node unfit for the job ("" when nothing)."""
    host = host or socket.gethostname()
    try:
        seen = (run_dir / NONCE_FILE).read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        seen = ""
    except OSError as exc:
        return f"cannot read the run directory {run_dir}: {exc.strerror or exc}"
    if seen != nonce:
        return f"its {run_dir} {NOT_SHARED} (no shared filesystem mounted there, or a stale mount)"
    probe = run_dir / f".nodecheck-{host}-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"cannot write in the run directory {run_dir}: {exc.strerror or exc}"
    return _gpus_missing(gpus) if gpus > 0 else ""


def _gpus_missing(gpus: int) -> str:
    """ "" when `nvidia-smi -L` lists at least `gpus` GPUs, or there is no nvidia-smi to ask."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=GPU_LIST_SECONDS)
    except subprocess.TimeoutExpired:
        return f"nvidia-smi -L did not answer within {GPU_LIST_SECONDS} s"
    except OSError as exc:
        return f"nvidia-smi -L failed: {exc}"
    found = sum(line.startswith("GPU ") for line in done.stdout.splitlines())
    if done.returncode != 0 or found < gpus:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return f"nvidia-smi -L lists {found} of the {gpus} GPUs the job asks for ({said[0]})"
    return ""


def parse_reports(text: str) -> dict[str, str]:
    """The nodes' lines, node -> what is wrong ("" when fit); lines of anything else are skipped."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        node, sep, said = line.partition("\t")
        if sep and node.strip():
            found[node.strip()] = "" if said.strip() == OK else said.strip()
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m dist_jobs.backends.slurm.nodecheck")
    p.add_argument("run_dir", type=Path)
    p.add_argument("nonce")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per node the job asks for")
    args = p.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    problem = check(args.run_dir, args.nonce, args.gpus, node)
    print(f"{node}\t{problem or OK}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
