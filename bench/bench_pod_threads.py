"""A pod's training process with the threads the PyTorchJob now gives it (OMP_NUM_THREADS =
cpus_per_task, here 1) vs torch's default of a thread per core (what it had before), while the
node's other cores are busy, as they are with other pods on the node.

    .venv/bin/python bench/bench_pod_threads.py [--pairs 3] [--steps 32]

Each side is a fresh `python -m dist_jobs.train` as one process of a pod runs it (a world of one,
resnet18 on 32 px fake images, batch 8), with `OMP_NUM_THREADS` taken from the manifest
`dist-jobs render --backend k8s` writes for a spec with `cpus_per_task: 1`. Every other core of
this machine runs a busy loop meanwhile (the neighbours). The two sides alternate; medians of the
process's wall time and CPU time (user + system) are compared, and the same pair once more with
no neighbours (the quiet node).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from dist_jobs.render import render
from dist_jobs.spec.load import load_spec

SPEC = {"name": "threads", "nodes": 1, "procs_per_node": 1, "cpus_per_task": 1, "image": "img:1"}
RANK_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def rendered_threads() -> str:
    """OMP_NUM_THREADS of the pod's container, as rendered."""
    doc = yaml.safe_load(render(load_spec(data=SPEC), "k8s"))
    container = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return next(e["value"] for e in container["env"] if e["name"] == "OMP_NUM_THREADS")


@contextmanager
def neighbours(count: int) -> Iterator[None]:
    """`count` processes that keep a core busy each."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def once(threads: str | None, steps: int, port: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one training process; `threads` None: torch's default."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(RANK_ENV, MASTER_PORT=str(port), DIST_JOBS_BACKEND="local")
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "dist_jobs.train", "--model", "resnet18", "--data", "fake"]
        argv += ["--image-size", "32", "--fake-samples", str(8 * steps), "--batch-size", "8", "--epochs", "1"]
        argv += ["--device", "cpu", "--checkpoint-dir", str(Path(tmp) / "ckpt"), "--no-eval-every-epoch"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compare(pairs: int, steps: int, threads: str) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    ours, default = [], []
    for i in range(pairs):
        ours.append(once(threads, steps, 29600 + 2 * i))
        default.append(once(None, steps, 29601 + 2 * i))
    return ours, default


def report(label: str, ours: list[tuple[float, float]], default: list[tuple[float, float]]) -> None:
    for what, index in (("wall", 0), ("CPU", 1)):
        mine, other = statistics.median(r[index] for r in ours), statistics.median(r[index] for r in default)
        print(f"{label} {what}: rendered threads {mine:.2f} s, a thread per core {other:.2f} s: {mine / other:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    threads = rendered_threads()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; the manifest gives OMP_NUM_THREADS={threads}")
    with neighbours(cores - 1):
        report("busy node", *compare(args.pairs, args.steps, threads))
    report("quiet node", *compare(args.pairs, args.steps, threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
